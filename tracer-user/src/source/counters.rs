//! Reading the kernel's per-CPU counters (`COUNTERS`): seen, emitted and dropped by reason, per probe.
use aya::{
    Ebpf,
    maps::{MapData, PerCpuArray},
};
use serde::Serialize;
use tracer_common::{counter, map_names, probe};

/// Counters for one probe, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProbeCounters {
    pub seen: u64,
    pub emitted: u64,
    pub dropped_ringbuf_full: u64,
    pub dropped_inflight_full: u64,
    pub dropped_fd_map_full: u64,
    pub dropped_no_entry: u64,
    pub dropped_count_map_full: u64,
    /// Calls counted in an in-kernel aggregate instead of a ring-buffer record.
    pub aggregated: u64,
}

impl ProbeCounters {
    pub fn dropped(&self) -> u64 {
        self.dropped_ringbuf_full
            + self.dropped_inflight_full
            + self.dropped_fd_map_full
            + self.dropped_no_entry
            + self.dropped_count_map_full
    }
}

/// All probes' counters, indexed by `tracer_common::probe` id.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KernelCounters {
    pub probes: Vec<(String, ProbeCounters)>,
}

impl KernelCounters {
    pub fn total(&self) -> ProbeCounters {
        let mut t = ProbeCounters::default();
        for (_, c) in &self.probes {
            t.seen += c.seen;
            t.emitted += c.emitted;
            t.dropped_ringbuf_full += c.dropped_ringbuf_full;
            t.dropped_inflight_full += c.dropped_inflight_full;
            t.dropped_fd_map_full += c.dropped_fd_map_full;
            t.dropped_no_entry += c.dropped_no_entry;
            t.dropped_count_map_full += c.dropped_count_map_full;
            t.aggregated += c.aggregated;
        }
        t
    }
    pub fn get(&self, name: &str) -> ProbeCounters {
        self.probes.iter().find(|(n, _)| n == name).map(|(_, c)| *c).unwrap_or_default()
    }
}

/// Sum `COUNTERS` over CPUs.
pub fn read(ebpf: &Ebpf) -> Result<KernelCounters, aya::maps::MapError> {
    let map = ebpf
        .map(map_names::COUNTERS)
        .ok_or(aya::maps::MapError::InvalidName { name: map_names::COUNTERS.to_string() })?;
    let arr: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(map)?;
    let mut out = KernelCounters::default();
    for p in 0..probe::COUNT {
        let slot = |s: u32| -> Result<u64, aya::maps::MapError> {
            let v = arr.get(&(p * counter::SLOTS + s), 0)?;
            Ok(v.iter().sum())
        };
        out.probes.push((
            probe::NAMES[p as usize].to_string(),
            ProbeCounters {
                seen: slot(counter::SEEN)?,
                emitted: slot(counter::EMITTED)?,
                dropped_ringbuf_full: slot(counter::DROP_RINGBUF_FULL)?,
                dropped_inflight_full: slot(counter::DROP_INFLIGHT_FULL)?,
                dropped_fd_map_full: slot(counter::DROP_FD_MAP)?,
                dropped_no_entry: slot(counter::DROP_NO_ENTRY)?,
                dropped_count_map_full: slot(counter::DROP_COUNT_MAP)?,
                aggregated: slot(counter::AGGREGATED)?,
            },
        ));
    }
    Ok(out)
}
