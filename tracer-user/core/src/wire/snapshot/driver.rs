//! The driver ledger (`state::snapshot`) as `DriverLedger`: its rows, totals, completeness and
//! counters.
use crate::{
    decode::MalformedReason,
    state::snapshot::{
        CgroupRow, Completeness, GpuRow, ProcessRow, Snapshot as DriverSnapshot, StateCounters, Totals, Usage,
    },
};

use super::codec::{Count, Counts, Each, Map, Msg, OrDefault, wire_message};

// The fixed sets of names behind the `&'static str`-keyed counters, where their source offers no
// list. Keep each in step with the function named above it (tests check those they can build).

/// `decode::Event::kind_name` (`StateCounters::events`).
const EVENT_KINDS: &[&str] = &[
    "fd_opened",
    "fd_closed",
    "fd_duped",
    "ioctl",
    "uvm_mapped",
    "uvm_unmapped",
    "process_exec",
    "process_exit",
    "process_fork",
    "cgroup_removed",
    "cuda_alloc",
    "cuda_free",
    "cuda_function",
    "cuda_launch",
    "cuda_timed",
];
/// `decode::IoctlOp::kind_name` (`StateCounters::ioctls_by_op`, `failed_by_op`).
const IOCTL_OPS: &[&str] = &[
    "rm_alloc",
    "rm_free",
    "vid_heap_alloc",
    "vid_heap_free",
    "vid_heap_other",
    "alloc_memory",
    "rm_control",
    "rm_dup_object",
    "rm_map_memory",
    "rm_unmap_memory",
    "register_fd",
    "card_info",
    "check_version",
    "other_frontend",
    "uvm_initialize",
    "uvm_mm_initialize",
    "uvm_register_gpu",
    "uvm_unregister_gpu",
    "uvm_create_external_range",
    "uvm_map_external",
    "uvm_unmap_external",
    "uvm_free",
    "uvm_pageable_mem_access",
    "uvm_validate_va_range",
    "uvm_other",
    "other_device",
    "malformed",
];
/// `decode::DeviceKind::as_str` (`StateCounters::ioctls_by_device`).
pub(super) const DEVICE_KINDS: &[&str] = &["unknown", "ctl", "gpu", "uvm", "uvm_tools", "modeset", "caps"];
/// The state ledger's release causes (`StateCounters::released_by`).
const RELEASE_CAUSES: &[&str] =
    &["free", "parent_free", "client_free", "fd_release", "process_exit", "pid_reuse", "evicted", "replaced"];

wire_message! {
    DriverSnapshot => DriverLedger {
        totals: Msg,
        cgroups: Each,
        processes: Each,
        gpus: Each,
        counters: Msg,
    }
}

wire_message! {
    Totals => DriverTotals {
        usage: Msg,
        processes: Count,
        cgroups: Count,
        live_allocations: Count,
        // Absent (an older agent): nothing known to be missing.
        completeness: OrDefault,
    }
}

wire_message! {
    Usage => Usage {
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
    }
}

wire_message! {
    Completeness => LedgerCompleteness {
        from_before_agent,
        records_lost_since_unix_ns,
        nvml_bytes_from_before_agent,
    }
}

wire_message! {
    CgroupRow => DriverCgroup {
        cgroup_id,
        path,
        processes: Count,
        removed,
        usage: Msg,
        completeness: OrDefault,
    }
}

wire_message! {
    ProcessRow => DriverProcess {
        tgid,
        start_time_ticks,
        comm,
        cgroup_id,
        fds: Count,
        gpu_minors,
        clients: Count,
        handles: Count,
        usage: Msg,
        completeness: OrDefault,
    }
}

wire_message! {
    GpuRow => DriverGpu {
        minor,
        usage: Msg,
        completeness: OrDefault,
    }
}

wire_message! {
    StateCounters => DriverCounters {
        events: Counts(EVENT_KINDS),
        ioctls_by_op: Counts(IOCTL_OPS),
        ioctls_by_device: Counts(DEVICE_KINDS),
        failed_by_op: Counts(IOCTL_OPS),
        rm_control_by_cmd: Map,
        rm_control_other,
        malformed_by_reason: Counts(&MalformedReason::ALL.map(MalformedReason::as_str)),
        uvm_map_external,
        uvm_unmap_external,
        uvm_free,
        allocations,
        frees,
        released_by: Counts(RELEASE_CAUSES),
        dup_references,
        dup_unknown_source,
        ownership_transfers,
        implausible_sizes,
        unknown_handle_frees,
        stale_handles_replaced,
        inferred_gpu_attributions,
        unknown_gpu_attributions,
        handle_table_full,
        untracked_allocations,
        fd_table_full,
        unknown_fd_closes,
        stale_fds_replaced,
        managed_table_full,
        unknown_munmaps,
        evicted_processes,
        pid_reuse,
        forks,
        cgroups_removed,
        evicted_cgroups,
        records_after_exit,
    }
}
