//! The immutable, serialisable view of the state at one moment.

use std::collections::BTreeMap;

use serde::Serialize;

/// Live memory and cumulative counts of one row (a process, a cgroup, a GPU, or the total).
///
/// The byte fields are live (they go down on free); the counts are cumulative for the row's
/// lifetime. Byte buckets are disjoint: device memory, system memory (including pinned host pages),
/// GPU virtual-address reservations without backing, and managed (UVM `mmap`) ranges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Device (video) memory: RM memory classes in vidmem, VID_HEAP allocations, fabric memory.
    pub vidmem_bytes: u64,
    /// System memory allocated through RM, and pinned host pages (OS descriptors).
    pub sysmem_bytes: u64,
    /// GPU virtual-address reservations without backing (0x50a0, 0x70, VID_HEAP VIRTUAL).
    pub va_reserved_bytes: u64,
    /// Managed memory (`mmap` of `/dev/nvidia-uvm`): not device memory until touched.
    pub managed_bytes: u64,
    /// The part of `vidmem_bytes` whose GPU was inferred from the device instance (the process
    /// had several or no `/dev/nvidiaN` open).
    pub inferred_vidmem_bytes: u64,
    /// Live RM memory allocations charged to this row.
    pub live_allocations: u64,
    /// Live managed mappings charged to this row.
    pub managed_mappings: u64,
    /// Successful memory allocations charged to this row (cumulative).
    pub allocations: u64,
    /// Memory allocations released while charged to this row, by any path (cumulative).
    pub frees: u64,
    /// Ioctls seen (cumulative).
    pub ioctls: u64,
    /// Ioctls whose syscall or status said failure (cumulative; malformed ones not included).
    pub failed_calls: u64,
}

impl Usage {
    /// Are all live fields zero?
    pub fn is_idle(&self) -> bool {
        self.vidmem_bytes == 0
            && self.sysmem_bytes == 0
            && self.va_reserved_bytes == 0
            && self.managed_bytes == 0
            && self.inferred_vidmem_bytes == 0
            && self.live_allocations == 0
            && self.managed_mappings == 0
    }
}

/// Field by field: the sum of several rows (e.g. cgroups that resolve to one container).
impl std::ops::AddAssign<&Usage> for Usage {
    fn add_assign(&mut self, o: &Usage) {
        // Destructured, so that a new field cannot be left out of the sum.
        let Usage {
            vidmem_bytes,
            sysmem_bytes,
            va_reserved_bytes,
            managed_bytes,
            inferred_vidmem_bytes,
            live_allocations,
            managed_mappings,
            allocations,
            frees,
            ioctls,
            failed_calls,
        } = *o;
        self.vidmem_bytes += vidmem_bytes;
        self.sysmem_bytes += sysmem_bytes;
        self.va_reserved_bytes += va_reserved_bytes;
        self.managed_bytes += managed_bytes;
        self.inferred_vidmem_bytes += inferred_vidmem_bytes;
        self.live_allocations += live_allocations;
        self.managed_mappings += managed_mappings;
        self.allocations += allocations;
        self.frees += frees;
        self.ioctls += ioctls;
        self.failed_calls += failed_calls;
    }
}

/// Whether a ledger row holds every byte its live processes hold: the ledger is built from
/// records, so it cannot know allocations made before the agent started, nor ones whose record was
/// lost (a full ring buffer). A row says which, so that a figure that may be short is never shown
/// as exact. For a process: itself; for a cgroup, a GPU or the totals: its live processes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Completeness {
    /// Live processes that were already running when the agent started (found by the start-up
    /// `/proc` scan): what they allocated before is unknown to the ledger. NVML's per-process
    /// memory (the attribution's `memory_source`) still counts it.
    pub from_before_agent: u32,
    /// The earliest time (Unix ns) a live process here lost a record its ledger needed; `None`
    /// when none did.
    pub records_lost_since_unix_ns: Option<u64>,
    /// What NVML's per-process memory (`usedGpuMemory`) says the processes from before the agent
    /// hold now (on this row's GPU for a GPU row, on all GPUs otherwise): the figure to read
    /// instead of the ledger's. `None` when there are none, or NVML has no reading for them.
    pub nvml_bytes_from_before_agent: Option<u64>,
}

impl Completeness {
    /// Nothing is known to be missing.
    pub fn exact(&self) -> bool {
        self.from_before_agent == 0 && self.records_lost_since_unix_ns.is_none()
    }

    /// Add another process's (or row's) completeness to this one.
    pub fn merge(&mut self, o: &Completeness) {
        self.from_before_agent += o.from_before_agent;
        self.nvml_bytes_from_before_agent = match (self.nvml_bytes_from_before_agent, o.nvml_bytes_from_before_agent) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        self.records_lost_since_unix_ns = match (self.records_lost_since_unix_ns, o.records_lost_since_unix_ns) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }

    /// In words, for tables: `exact`, `2 from before the agent`, `records lost since <time>`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.from_before_agent > 0 {
            match self.nvml_bytes_from_before_agent {
                Some(b) => parts.push(format!(
                    "{} from before the agent (NVML: {})",
                    self.from_before_agent,
                    crate::format::human_bytes(b)
                )),
                None => parts.push(format!("{} from before the agent", self.from_before_agent)),
            }
        }
        if let Some(t) = self.records_lost_since_unix_ns {
            parts.push(format!("records lost since {}", crate::format::unix_time(t)));
        }
        if parts.is_empty() { "exact".into() } else { parts.join(", ") }
    }
}

/// One live process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcessRow {
    pub tgid: u32,
    /// Start time in clock ticks since boot (`/proc/PID/stat` field 22), as given by the caller;
    /// 0 when it was never known.
    pub start_time_ticks: u64,
    pub comm: Option<String>,
    /// cgroup of its latest event.
    pub cgroup_id: u64,
    /// Open NVIDIA fds.
    pub fds: usize,
    /// Distinct `/dev/nvidiaN` minors open.
    pub gpu_minors: Vec<u32>,
    /// RM clients and handles tracked.
    pub clients: usize,
    pub handles: usize,
    pub usage: Usage,
    pub completeness: Completeness,
}

/// One cgroup with live processes or live memory (or recent activity).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CgroupRow {
    pub cgroup_id: u64,
    /// Filled by the caller's enrich step (`TracerState::set_cgroup_path`).
    pub path: Option<String>,
    /// Live processes whose latest event came from this cgroup.
    pub processes: usize,
    /// The cgroup directory was removed (the row stays until its memory is gone).
    pub removed: bool,
    pub usage: Usage,
    /// Over its live processes.
    pub completeness: Completeness,
}

/// One GPU bucket: a `/dev/nvidiaN` minor, or `None` for memory whose GPU is unknown (and all
/// managed memory, which has no GPU until touched).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuRow {
    pub minor: Option<u32>,
    pub usage: Usage,
    /// Over the live processes with this GPU open (the unknown bucket: all live processes).
    pub completeness: Completeness,
}

/// Counters of the state stage (cumulative since start).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StateCounters {
    /// Events applied, by kind.
    pub events: BTreeMap<&'static str, u64>,
    /// Ioctls by decoded operation.
    pub ioctls_by_op: BTreeMap<&'static str, u64>,
    /// Ioctls by device kind.
    pub ioctls_by_device: BTreeMap<&'static str, u64>,
    /// Failed ioctls (syscall or status) by decoded operation.
    pub failed_by_op: BTreeMap<&'static str, u64>,
    /// RM_CONTROL calls by command (at most `max_control_cmds` distinct commands).
    pub rm_control_by_cmd: BTreeMap<u32, u64>,
    /// RM_CONTROL calls whose command did not fit the bounded table.
    pub rm_control_other: u64,
    /// Malformed ioctls by reason.
    pub malformed_by_reason: BTreeMap<&'static str, u64>,
    /// Successful UVM_MAP_EXTERNAL_ALLOCATION / UVM_UNMAP_EXTERNAL / UVM_FREE calls.
    pub uvm_map_external: u64,
    pub uvm_unmap_external: u64,
    pub uvm_free: u64,
    /// Successful memory allocations / allocations released.
    pub allocations: u64,
    pub frees: u64,
    /// Allocations released, by cause (`free`, `parent_free`, `client_free`, `fd_release`,
    /// `process_exit`, `pid_reuse`, `evicted`, `replaced`).
    pub released_by: BTreeMap<&'static str, u64>,
    /// RM_DUP_OBJECT references added to existing memory (not counted as new memory).
    pub dup_references: u64,
    /// RM_DUP_OBJECT whose source was not known (tracked as a placeholder without memory).
    pub dup_unknown_source: u64,
    /// Allocations whose charge moved to another process when the owner dropped its references.
    pub ownership_transfers: u64,
    /// Successful allocations whose size exceeded `MAX_PLAUSIBLE_ALLOCATION_BYTES` (charged as 0).
    pub implausible_sizes: u64,
    /// Frees of handles that were not tracked.
    pub unknown_handle_frees: u64,
    /// Allocations of a handle that was still tracked (a missed free): the old one is released.
    pub stale_handles_replaced: u64,
    /// GPU attributions made from the device instance (inferred) or not made (unknown).
    pub inferred_gpu_attributions: u64,
    pub unknown_gpu_attributions: u64,
    /// Objects not tracked because the process's handle table was full (and memory thereby missed).
    pub handle_table_full: u64,
    pub untracked_allocations: u64,
    /// Fds not tracked because the fd table was full; closes of fds never seen opened.
    pub fd_table_full: u64,
    pub unknown_fd_closes: u64,
    /// Opens of an fd number still tracked (a missed close).
    pub stale_fds_replaced: u64,
    /// Managed mappings not tracked (table full); unmaps of unknown addresses.
    pub managed_table_full: u64,
    pub unknown_munmaps: u64,
    /// Processes evicted because the process table was full.
    pub evicted_processes: u64,
    /// Processes replaced by a new one with the same tgid and another start time.
    pub pid_reuse: u64,
    /// Fork events whose child is handled by the caller's `/proc` seeding.
    pub forks: u64,
    /// Cgroup rows dropped after their directory was removed; rows dropped for the table cap.
    pub cgroups_removed: u64,
    pub evicted_cgroups: u64,
    /// Count-only records read after their process's exit had been applied (the bulk ring is not
    /// ordered with the ledger ring): charged to their cgroup, the process not brought back.
    pub records_after_exit: u64,
}

/// Totals across all rows, and table sizes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    pub usage: Usage,
    pub processes: usize,
    pub cgroups: usize,
    pub live_allocations: usize,
    /// Over every live process.
    pub completeness: Completeness,
}

/// The state at one moment: per-cgroup, per-process and per-GPU rows, totals and counters.
///
/// For every byte bucket, Σ processes = Σ cgroups = Σ GPUs = totals.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Snapshot {
    pub totals: Totals,
    /// Sorted by cgroup id.
    pub cgroups: Vec<CgroupRow>,
    /// Sorted by tgid.
    pub processes: Vec<ProcessRow>,
    /// Sorted by minor, the unknown bucket last.
    pub gpus: Vec<GpuRow>,
    pub counters: StateCounters,
}

impl Snapshot {
    /// Give the rows of processes from before the agent NVML's figure for their memory:
    /// `used(pid, minor)` is NVML's per-process memory of `pid` on the GPU `minor` (`None`: on all
    /// GPUs), or `None` without a reading. Processes set theirs; cgroups, GPUs and the totals sum
    /// their live processes' (a GPU row: on that GPU only).
    pub fn add_nvml_memory(&mut self, used: impl Fn(u32, Option<u32>) -> Option<u64>) {
        let mut by_cgroup: BTreeMap<u64, Option<u64>> = BTreeMap::new();
        let mut by_gpu: BTreeMap<Option<u32>, Option<u64>> = BTreeMap::new();
        let mut total: Option<u64> = None;
        let add = |acc: &mut Option<u64>, v: Option<u64>| {
            if let Some(v) = v {
                *acc = Some(acc.unwrap_or(0) + v);
            }
        };
        for p in self.processes.iter_mut().filter(|p| p.completeness.from_before_agent > 0) {
            let all = used(p.tgid, None);
            p.completeness.nvml_bytes_from_before_agent = all;
            add(by_cgroup.entry(p.cgroup_id).or_default(), all);
            for m in &p.gpu_minors {
                add(by_gpu.entry(Some(*m)).or_default(), used(p.tgid, Some(*m)));
            }
            add(&mut total, all);
        }
        by_gpu.insert(None, total);
        for c in &mut self.cgroups {
            c.completeness.nvml_bytes_from_before_agent = by_cgroup.get(&c.cgroup_id).copied().flatten();
        }
        for g in &mut self.gpus {
            g.completeness.nvml_bytes_from_before_agent = by_gpu.get(&g.minor).copied().flatten();
        }
        self.totals.completeness.nvml_bytes_from_before_agent = total;
    }
}
