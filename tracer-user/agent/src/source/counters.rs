//! Reading the kernel's per-CPU counters (`COUNTERS`): seen, emitted and dropped by reason, per probe.
use aya::{
    Ebpf,
    maps::{MapData, PerCpuArray},
};
use tracer_common::{counter, map_names, probe};

use tracer_core::model::counters::{KernelCounters, ProbeCounters};

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
        // Slot by slot in order: the kernel's `seen` is counted first, so it is read first.
        let mut c =
            ProbeCounters { seen: slot(counter::SEEN)?, emitted: slot(counter::EMITTED)?, ..Default::default() };
        for s in counter::DROP_FIRST..=counter::DROP_LAST {
            c.set_dropped(s, slot(s)?);
        }
        c.aggregated = slot(counter::AGGREGATED)?;
        out.probes.push((probe::NAMES[p as usize].to_string(), c));
    }
    Ok(out)
}
