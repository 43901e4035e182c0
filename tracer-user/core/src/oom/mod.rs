//! Out-of-memory forensics (issue 43): an allocation that failed for lack of GPU memory, told
//! with who held that GPU's memory at that moment.
//!
//! The failures come from both ledgers' inputs: an RM allocation whose status is the driver's
//! `NV_ERR_NO_MEMORY` ([`driver_oom`]), and a device-memory libcuda allocation
//! (`cuMemAlloc*`, `cuMemCreate`, `cuMemAllocAsync`, managed included; pinned host memory not)
//! returning `CUDA_ERROR_OUT_OF_MEMORY` ([`cuda_oom`]). One program's out-of-memory is usually
//! both (libcuda's failed call made a failed RM allocation first), and a retry loop repeats it
//! thousands of times a second: the [`OomDetector`] folds the failures of one process into a
//! **burst** (failures less than [`OomSettings::quiet_ns`] apart, at most
//! [`OomSettings::max_burst_ns`] long), and reports each burst once, when it closes, with its
//! count. The split of the GPU's memory is taken at the burst's first failure, from the latest
//! attribution interval (the driver and CUDA ledgers joined with NVML's reading, split as the
//! attribution splits it: each container's bytes, driver reserved, unattributed, free), with its
//! age, so a reader knows how old "who held it" is.
//!
//! Memory is bounded: at most [`OomSettings::max_open`] bursts are open; a failure past that is
//! counted ([`OomDetector::dropped`]), never kept.
use std::{collections::HashMap, sync::Arc};

use serde::Serialize;

use crate::attribution::{AttributionSnapshot, GpuAttribution};

/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub const CUDA_ERROR_OUT_OF_MEMORY: u32 = 2;

/// Whether an RM allocation's status is the driver's out-of-memory.
pub fn driver_oom(status: u32) -> bool {
    status == tracer_common::nv::NV_ERR_NO_MEMORY
}

/// Whether a libcuda allocation call (`entry`, a `cuda_entry` id) that returned `result` ran out
/// of GPU memory. Pinned host memory (`cuMemAllocHost`) is host memory: not a GPU out-of-memory.
pub fn cuda_oom(entry: u32, result: u32) -> bool {
    use tracer_common::cuda_entry as e;
    result == CUDA_ERROR_OUT_OF_MEMORY
        && matches!(
            entry,
            e::MEM_ALLOC
                | e::MEM_ALLOC_ASYNC
                | e::MEM_ALLOC_ASYNC_PTSZ
                | e::MEM_ALLOC_PITCH
                | e::MEM_CREATE
                | e::MEM_ALLOC_MANAGED
        )
}

/// Which call failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum OomSource {
    /// An RM allocation (`NV_ESC_RM_ALLOC`, `NVOS32`'s alloc, `NV_ESC_RM_ALLOC_MEMORY`).
    Driver { status: u32 },
    /// A libcuda allocation call, by entry point name.
    Cuda { entry_point: String, result: u32 },
}

/// One allocation that failed for lack of GPU memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailedAlloc {
    /// When it returned, on the events' clock (CLOCK_MONOTONIC) and the wall clock.
    pub ktime_ns: u64,
    pub unix_ns: u64,
    pub tgid: u32,
    pub tid: u32,
    pub cgroup_id: u64,
    /// The GPU's UUID (or MIG instance's), when the call tells which.
    pub gpu: Option<String>,
    /// The bytes asked for.
    pub bytes: u64,
    pub source: OomSource,
}

/// Who held the GPU's memory when the burst began.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MemorySplit {
    /// The GPU (or MIG instance) the split is of.
    pub gpu: String,
    pub gpu_name: Option<String>,
    /// Each container's bytes on that GPU, largest first.
    pub holders: Vec<Holder>,
    pub driver_reserved: u64,
    pub unattributed: u64,
    pub free: u64,
    pub total: u64,
    /// How old the split is at the first failure: from the end of the attribution interval it
    /// comes from (the ledgers and NVML's reading were taken then).
    pub age_ns: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Holder {
    pub cgroup_id: u64,
    /// `namespace/pod/container`, else what the cgroup path says.
    pub name: Option<String>,
    pub bytes: u64,
}

/// One out-of-memory burst, reported when it closes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OomEvent {
    pub tgid: u32,
    /// The thread of the first failure.
    pub tid: u32,
    pub cgroup_id: u64,
    /// The GPU, when one of the burst's failures told it.
    pub gpu: Option<String>,
    /// The first failure: when, how many bytes, which call.
    pub first_ktime_ns: u64,
    pub first_unix_ns: u64,
    pub last_ktime_ns: u64,
    pub bytes: u64,
    /// The largest request of the burst.
    pub max_bytes: u64,
    pub source: OomSource,
    /// Failures folded into this event (driver and libcuda calls both count).
    pub count: u64,
    /// The GPU's memory at the first failure; `None` without an attribution interval (no NVML)
    /// or when the GPU is not known.
    pub split: Option<MemorySplit>,
}

/// How failures are folded.
#[derive(Clone, Copy, Debug)]
pub struct OomSettings {
    /// A burst closes after this long without a failure.
    pub quiet_ns: u64,
    /// A burst that never goes quiet is reported at least this often (a count per period).
    pub max_burst_ns: u64,
    /// Bursts open at once, at most.
    pub max_open: usize,
}

impl Default for OomSettings {
    fn default() -> Self {
        OomSettings { quiet_ns: 1_000_000_000, max_burst_ns: 10_000_000_000, max_open: 1024 }
    }
}

/// A burst being folded.
#[derive(Debug)]
struct Open {
    event: OomEvent,
    /// The attribution at the first failure, for the split when the GPU becomes known.
    attribution: Option<Arc<AttributionSnapshot>>,
}

/// Folds failed allocations into bursts and reports each once.
#[derive(Debug, Default)]
pub struct OomDetector {
    settings: OomSettings,
    open: HashMap<(u64, u32), Open>,
    /// Bursts closed by a failure that came after them, for the next [`OomDetector::poll`].
    closed: Vec<OomEvent>,
    /// Failures not kept because `max_open` bursts were open.
    dropped: u64,
    /// Bursts reported, and failures seen, since start.
    reported: u64,
    failures: u64,
}

impl OomDetector {
    pub fn new(settings: OomSettings) -> Self {
        OomDetector { settings, ..Default::default() }
    }

    /// A failed allocation. `latest` is the newest attribution interval at that moment.
    pub fn failure(&mut self, f: FailedAlloc, latest: Option<&Arc<AttributionSnapshot>>) {
        self.failures += 1;
        let key = (f.cgroup_id, f.tgid);
        // A failure after the quiet time, or past the longest burst, starts a new burst.
        let s = self.settings;
        if self.open.get(&key).is_some_and(|o| {
            f.ktime_ns.saturating_sub(o.event.last_ktime_ns) >= s.quiet_ns
                || f.ktime_ns.saturating_sub(o.event.first_ktime_ns) >= s.max_burst_ns
        }) && let Some(o) = self.open.remove(&key)
        {
            self.closed.push(o.event);
        }
        if let Some(o) = self.open.get_mut(&key) {
            let e = &mut o.event;
            e.count += 1;
            e.last_ktime_ns = e.last_ktime_ns.max(f.ktime_ns);
            e.max_bytes = e.max_bytes.max(f.bytes);
            if e.gpu.is_none() && f.gpu.is_some() {
                e.gpu = f.gpu;
                e.split = split(o.attribution.as_deref(), e.gpu.as_deref(), e.first_unix_ns);
            }
            return;
        }
        if self.open.len() >= self.settings.max_open {
            self.dropped += 1;
            return;
        }
        let split = split(latest.map(|a| &**a), f.gpu.as_deref(), f.unix_ns);
        let event = OomEvent {
            tgid: f.tgid,
            tid: f.tid,
            cgroup_id: f.cgroup_id,
            gpu: f.gpu,
            first_ktime_ns: f.ktime_ns,
            first_unix_ns: f.unix_ns,
            last_ktime_ns: f.ktime_ns,
            bytes: f.bytes,
            max_bytes: f.bytes,
            source: f.source,
            count: 1,
            split,
        };
        self.open.insert(key, Open { event, attribution: latest.cloned() });
    }

    /// The bursts that closed by `now_ktime_ns` (quiet for `quiet_ns`, or open for
    /// `max_burst_ns`: then the next failure starts a new burst), oldest first.
    pub fn poll(&mut self, now_ktime_ns: u64) -> Vec<OomEvent> {
        let s = self.settings;
        let done: Vec<(u64, u32)> = self
            .open
            .iter()
            .filter(|(_, o)| {
                let e = &o.event;
                now_ktime_ns.saturating_sub(e.last_ktime_ns) >= s.quiet_ns
                    || now_ktime_ns.saturating_sub(e.first_ktime_ns) >= s.max_burst_ns
            })
            .map(|(k, _)| *k)
            .collect();
        let mut out = std::mem::take(&mut self.closed);
        out.extend(done.iter().filter_map(|k| self.open.remove(k)).map(|o| o.event));
        out.sort_by_key(|e| (e.first_ktime_ns, e.cgroup_id, e.tgid));
        self.reported += out.len() as u64;
        out
    }

    /// Failures not kept because too many bursts were open.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// (failures seen, bursts reported) since start.
    pub fn counts(&self) -> (u64, u64) {
        (self.failures, self.reported)
    }
}

/// The GPU's memory lines in `a`, as they stood at `at_unix_ns`.
fn split(a: Option<&AttributionSnapshot>, gpu: Option<&str>, at_unix_ns: u64) -> Option<MemorySplit> {
    let a = a?;
    let gpu = gpu?;
    let g: &GpuAttribution = a.gpus.iter().find(|g| g.uuid == gpu)?;
    let m = g.memory?;
    let mut holders: Vec<Holder> = g
        .containers
        .iter()
        .filter(|c| c.memory_bytes > 0)
        .map(|c| Holder { cgroup_id: c.container.0, name: c.name.clone(), bytes: c.memory_bytes })
        .collect();
    holders.sort_by_key(|h| (std::cmp::Reverse(h.bytes), h.cgroup_id));
    Some(MemorySplit {
        gpu: g.uuid.clone(),
        gpu_name: g.name.clone(),
        holders,
        driver_reserved: m.driver_reserved,
        unattributed: m.unattributed,
        free: m.free,
        total: m.total,
        age_ns: at_unix_ns.saturating_sub(a.start_unix_ns + a.interval_ns),
    })
}

#[cfg(test)]
mod tests;
