//! Counters of the pipeline and the accounting identity they must satisfy.
use std::collections::BTreeMap;

use serde::Serialize;

/// Counters of the user-space stages.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PipelineStats {
    /// Records taken out of the ring buffer.
    pub received: u64,
    /// Records decoded into events.
    pub decoded: u64,
    /// Records that failed to decode, by reason (never silently dropped: counted here).
    pub decode_errors: BTreeMap<&'static str, u64>,
    /// NVIDIA fds found by the start-up `/proc` scan (and for forked children).
    pub seeded_fds: u64,
    /// Processes whose `/proc/PID/fd` could not be read during a scan.
    pub scan_unreadable: u64,
    /// Tracked processes found gone (or their PID reused) without an exit record, and forgotten.
    pub processes_reconciled: u64,
    /// Processes that lost a ledger record but were not tracked (their open record was lost too,
    /// or they had exited): the global drop counters cover them.
    pub lost_records_untracked: u64,
    /// Fds a scan found under an NVIDIA name whose file is not an NVIDIA device (not tracked).
    pub scan_not_devices: u64,
    /// Kernel `NV_FDS` and `UVM_MAPS` entries removed after process exit.
    pub fd_map_cleanups: u64,
    /// Failed kernel map updates from user space (seeding, cleanup).
    pub fd_map_errors: u64,
    /// `INFLIGHT` entries of threads that died inside a traced syscall, removed by the sweep.
    pub inflight_swept: u64,
    /// libcuda copies found in GPU processes' mappings (e.g. a container's own) and probed.
    pub cuda_libraries_found: u64,
    /// Failures probing such a copy (the reason is logged).
    pub cuda_library_errors: u64,
    /// Such copies detached after the last process known to map them exited.
    pub cuda_libraries_detached: u64,
    /// cgroup ids first seen whose path the kernel gave by id (at once, no walk).
    pub cgroup_paths_by_id: u64,
    /// cgroup ids first seen whose path a walk of the hierarchy found (lookups by id refused).
    pub cgroup_paths_by_walk: u64,
    /// cgroup path lookups that found nothing (removed, or a walk not due yet).
    pub cgroup_paths_unresolved: u64,
    /// Full walks of the cgroup hierarchy.
    pub cgroup_walks: u64,
}

/// `seen = received + aggregated + dropped`, per probe and in total.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Accounting {
    pub seen: u64,
    pub received: u64,
    /// Calls counted in an in-kernel aggregate (libcuda launches) rather than sent as records.
    pub aggregated: u64,
    pub dropped: u64,
    /// Records emitted but not yet drained when the counters were read (0 when quiescent).
    pub in_flight: i64,
    /// Does the identity hold exactly (with nothing in flight)?
    pub exact: bool,
}

/// The CUDA ledger beside the driver ledger for one process that appears in both. They differ for
/// known reasons: libcuda allocates device memory for itself (contexts, channels, pushbuffers) that
/// no cuMemAlloc asks for, so the driver sees more; the driver rounds sizes up (2 MiB pages); one
/// RM allocation can back several CUDA ones (sub-allocation) or the reverse; cuMemAllocManaged is
/// a managed mapping for the driver, not device memory, until touched.
#[derive(Clone, Debug, Serialize)]
pub struct LedgerCheck {
    pub tgid: u32,
    pub cgroup_id: u64,
    /// Live bytes of cuMemAlloc*/cuMemCreate (CUDA ledger).
    pub cuda_device_bytes: u64,
    /// Live device memory from RM allocations (driver ledger).
    pub driver_vidmem_bytes: u64,
    /// `driver - cuda`: positive when the driver holds more than the application asked libcuda for.
    pub driver_minus_cuda: i64,
}
