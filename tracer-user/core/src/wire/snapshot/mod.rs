//! `AgentSnapshot` ⇄ `gputracer.v1.Snapshot`, and the agent's status as `gputracer.v1.AgentStatus`.
//!
//! The agent serves [`snapshot_to_proto`] and [`status_to_proto`]; `top --connect` turns the
//! message back with [`snapshot_from_proto`] and renders it with the same code as a local `top`,
//! so the tables are the same. Field meanings are documented in `proto/gputracer/v1/snapshot.proto`.
//!
//! What [`snapshot_from_proto`] does not restore, because the message does not carry it:
//! - of the NVML sample, only the per-GPU summary (index, UUID, name, minor, PCI bus id, memory,
//!   utilization, power, energy, MIG mode and devices, lost, missing readings) and the sample's
//!   time, versions, cost and missing readings; clocks, temperature, compute mode, the process
//!   lists, process utilization samples, MIG devices' process lists and `taken_mono_ns` (a clock
//!   of the agent's host, meaningless elsewhere) come back empty;
//! - `taken_at_unix_ns` and `interval_ns` (not fields of [`AgentSnapshot`]: read them from the
//!   message);
//! - names outside the sets this build knows, in the counter maps keyed by `&'static str`: they
//!   are added up under [`OTHER`]; kernel drops for a reason this build does not know are not
//!   counted in any slot (the [`Accounting`](crate::model::Accounting) totals are carried apart
//!   and stay exact);
//! - the OTLP exporter's counters (`AgentSnapshot::otlp`: the agent's own export, not its view);
//! - the difference between an empty string and "unknown" in container identities and violation
//!   evidence (the wire says "empty: unknown"), and a violation's GPU that names nothing (read as
//!   "all GPUs").
use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
    sync::Arc,
};

use gpu_tracer_proto::v1;

use crate::{
    allocation::AllocationStatus,
    attribution::{
        AttributionSnapshot, Bill, ContainerKey, ContainerSummary, GpuAttribution, GpuRequest, IdleReservation,
        SharingMode,
        attributor::AttributorCounters,
        gpu::{
            ComputeLines, ComputeMethod, ContainerLine, CostBasis, CostLines, EnergyLines, LedgerSplit, MemoryLines,
            MemorySource, UnattributedMemory,
        },
        input::EnergySource,
        rightsizing::{Fit, Rightsizing},
    },
    config::{AttachMode, CostPolicy, UnusedCost},
    cuda::ledger::{CudaCgroupRow, CudaProcessRow, CudaSnapshot, CudaUsage},
    decode::MalformedReason,
    guardrails::{Evidence, GpuRef, Violation, ViolationCounts, ViolationKind, VisibleDevices},
    identity::{ContainerIdentity, KubeStatus},
    model::{
        Accounting, AgentSnapshot, AllocationUse, KubeView, KubernetesStatus, LedgerCheck, NvmlStatus, NvmlView,
        PipelineStats,
        counters::{KernelCounters, ProbeCounters, drop_reasons},
        probes::{FamilyStatus, KernelFeatures, LibraryReport, ProbeMode, ProbeReport},
    },
    nvml::model::{DeviceSample, MemoryInfo, MigInstance, Missing, NvmlSample, Utilization},
    state::snapshot::{
        CgroupRow, Completeness, GpuRow, ProcessRow, Snapshot as DriverSnapshot, StateCounters, Totals, Usage,
    },
    wire::events::container_proto,
};

/// Why a `gputracer.v1.Snapshot` could not be turned back into an [`AgentSnapshot`]. Each variant
/// names the field, as `Message.field`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    /// A sub-message the agent always sets is unset (or a `oneof` has no case set).
    #[error("{field} is missing")]
    Missing { field: &'static str },
    /// An enum field holds a number this build does not know (e.g. from a newer agent).
    #[error("{field} = {value} is not a value this build knows")]
    InvalidEnum { field: &'static str, value: i32 },
    /// An enum field is 0 (`*_UNSPECIFIED`): the agent never sends it, so the sender is not one.
    #[error("{field} is unspecified (0)")]
    Unspecified { field: &'static str },
    /// A string field that names one of a fixed set (a violation kind) names none of it.
    #[error("{field} = {value:?} is not a name this build knows")]
    UnknownName { field: &'static str, value: String },
}

impl SnapshotError {
    /// A short, stable label for a metric or a log field.
    pub fn reason(&self) -> &'static str {
        match self {
            SnapshotError::Missing { .. } => "missing",
            SnapshotError::InvalidEnum { .. } => "invalid_enum",
            SnapshotError::Unspecified { .. } => "unspecified",
            SnapshotError::UnknownName { .. } => "unknown_name",
        }
    }
}

type Result<T> = std::result::Result<T, SnapshotError>;

/// The key under which counts of names this build does not know are added up.
pub const OTHER: &str = "other";

// The fixed sets of names behind the `&'static str`-keyed maps, where their source offers no list.
// Keep each in step with the function named above it (tests check those they can build).

/// `decode::DecodeError::reason` (`PipelineStats::decode_errors`).
const DECODE_ERROR_REASONS: &[&str] = &["short", "unknown_kind", "bad_record_size", "bad_length"];
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
const DEVICE_KINDS: &[&str] = &["unknown", "ctl", "gpu", "uvm", "uvm_tools", "modeset", "caps"];
/// The state ledger's release causes (`StateCounters::released_by`).
const RELEASE_CAUSES: &[&str] =
    &["free", "parent_free", "client_free", "fd_release", "process_exit", "pid_reuse", "evicted", "replaced"];
/// The names the agent's `nvml::sampler::reason_label` gives (`NvmlView::failed_readings`).
pub const NVML_FAILURE_REASONS: &[&str] = &[
    "not_supported",
    "gpu_lost",
    "no_permission",
    "symbol_missing",
    "uninitialized",
    "invalid_argument",
    "not_found",
    "insufficient_size",
    "driver_not_loaded",
    "reset_required",
    "timeout",
    "unknown",
    "other",
];
/// `ContainerIdentity::kind` (identity/container's `kind_str`, and "unknown" without a path).
const CONTAINER_KINDS: &[&str] = &["container", "container-monitor", "pod", "host", "other", "unknown"];
/// `ContainerIdentity::runtime`.
const RUNTIMES: &[&str] = &["containerd", "cri-o", "docker"];
/// `ContainerIdentity::qos`.
const QOS_CLASSES: &[&str] = &["guaranteed", "burstable", "best-effort"];

/// The agent's snapshot as a message. `taken_at_unix_ns`: the wall clock when it was taken.
pub fn snapshot_to_proto(s: &AgentSnapshot, taken_at_unix_ns: u64) -> v1::Snapshot {
    v1::Snapshot {
        taken_at_unix_ns,
        interval_ns: s.attribution.as_ref().map_or(0, |a| a.interval_ns),
        driver: Some(driver_to_proto(&s.state)),
        cuda: Some(cuda_to_proto(&s.cuda)),
        ledger_checks: s.ledger_check.iter().map(ledger_check_to_proto).collect(),
        kernel_probes: s.kernel.probes.iter().map(|(name, c)| probe_counters_to_proto(name, c)).collect(),
        pipeline: Some(pipeline_to_proto(&s.pipeline)),
        accounting: Some(accounting_to_proto(&s.accounting)),
        attach_mode: attach_mode_to_proto(s.attach_mode).into(),
        driver_version: s.driver_version.clone(),
        nvml: Some(nvml_to_proto(&s.nvml)),
        attribution: s.attribution.as_deref().map(attribution_to_proto),
        containers: s.containers.iter().map(|(id, c)| container_to_proto(*id, c)).collect(),
        allocation_use: s.allocation_use.iter().map(allocation_use_to_proto).collect(),
        violations: s.violations.iter().map(violation_to_proto).collect(),
        violation_counts: Some(violation_counts_to_proto(&s.violation_counts)),
        kubernetes: Some(kube_to_proto(&s.kubernetes)),
    }
}

/// The snapshot back from a message: everything `top` and the attribution table read, and the
/// rest of what the message carries (see the module docs for what it does not). A required
/// sub-message that is unset, an enum that is 0 or unknown, or a violation kind this build does not
/// know is an error naming the field.
pub fn snapshot_from_proto(p: v1::Snapshot) -> Result<AgentSnapshot> {
    Ok(AgentSnapshot {
        state: driver_from_proto(required(p.driver, "Snapshot.driver")?)?,
        cuda: cuda_from_proto(required(p.cuda, "Snapshot.cuda")?)?,
        ledger_check: p.ledger_checks.into_iter().map(ledger_check_from_proto).collect(),
        kernel: KernelCounters { probes: p.kernel_probes.into_iter().map(probe_counters_from_proto).collect() },
        pipeline: pipeline_from_proto(required(p.pipeline, "Snapshot.pipeline")?),
        accounting: accounting_from_proto(required(p.accounting, "Snapshot.accounting")?),
        attach_mode: attach_mode_from_proto(p.attach_mode, "Snapshot.attach_mode")?,
        driver_version: p.driver_version,
        nvml: nvml_from_proto(required(p.nvml, "Snapshot.nvml")?)?,
        attribution: p.attribution.map(attribution_from_proto).transpose()?.map(Arc::new),
        containers: p.containers.into_iter().map(container_from_proto).collect::<Result<_>>()?,
        allocation_use: p.allocation_use.into_iter().map(allocation_use_from_proto).collect(),
        violations: p.violations.into_iter().map(violation_from_proto).collect::<Result<_>>()?,
        violation_counts: violation_counts_from_proto(required(p.violation_counts, "Snapshot.violation_counts")?),
        kubernetes: kube_from_proto(required(p.kubernetes, "Snapshot.kubernetes")?)?,
        // Not carried: the OTLP exporter's counters (the agent's own export, not its view).
        ..Default::default()
    })
}

/// The agent's status as a message: the probe report of its start, and the latest snapshot's
/// NVML, Kubernetes and counters (`taken_at_unix_ns`: when that snapshot was taken).
pub fn status_to_proto(
    s: &AgentSnapshot,
    report: &ProbeReport,
    agent_version: &str,
    taken_at_unix_ns: u64,
) -> v1::AgentStatus {
    v1::AgentStatus {
        agent_version: agent_version.to_string(),
        attach_mode: attach_mode_to_proto(report.attach_mode).into(),
        attach_reason: report.attach_reason.clone(),
        driver_version: s.driver_version.clone(),
        driver_abi: report.driver_abi.clone(),
        driver: Some(family_to_proto(&report.driver)),
        lifecycle: Some(family_to_proto(&report.lifecycle)),
        cuda: Some(family_to_proto(&report.cuda)),
        cuda_libraries: report.cuda_libraries.iter().map(library_to_proto).collect(),
        nvml_status: nvml_status_to_proto(s.nvml.status).into(),
        nvml_reason: s.nvml.reason.clone(),
        kubernetes_status: kube_status_to_proto(s.kubernetes.status).into(),
        kubernetes_detail: s.kubernetes.detail.clone(),
        accounting: Some(accounting_to_proto(&s.accounting)),
        pipeline: Some(pipeline_to_proto(&s.pipeline)),
        snapshot_taken_at_unix_ns: taken_at_unix_ns,
        kernel: Some(kernel_features_to_proto(&report.features)),
        api: s.api.map(|a| v1::ApiHub {
            published: a.published,
            subscribers: a.subscribers,
            subscriptions: a.subscriptions,
            refused: a.refused,
            lost: a.lost,
        }),
        otlp: s.otlp.as_ref().map(otlp_to_proto),
        device_check: Some(v1::DeviceCheck {
            enabled: report.device_check.enabled,
            simulated_files: report.device_check.simulated_files,
            detail: report.device_check.detail.clone(),
        }),
    }
}

fn otlp_to_proto(o: &crate::model::OtlpStats) -> v1::OtlpExport {
    v1::OtlpExport {
        endpoint: o.endpoint.clone(),
        protocol: o.protocol.to_string(),
        metric_points_exported: o.metric_points_exported,
        log_records_exported: o.log_records_exported,
        log_queue_length: o.log_queue_len as u64,
        log_queue_capacity: o.log_queue_capacity as u64,
        dropped: o
            .dropped
            .iter()
            .map(|d| v1::OtlpDropped { signal: d.signal.into(), reason: d.reason.into(), count: d.count })
            .collect(),
        last_error: o.last_error.clone().unwrap_or_default(),
        log_retries: o.log_retries,
    }
}

/// Both directions between a model enum and its generated twin with the same variant names:
/// `$to(model) -> v1::Enum`, and `$from(i32)` where `UNSPECIFIED` and unknown numbers are errors
/// naming `$field`.
macro_rules! enum_pair {
    ($to:ident, $from:ident, $enum:ident, $field:literal, [$($v:ident),+ $(,)?]) => {
        fn $to(value: $enum) -> v1::$enum {
            match value {
                $($enum::$v => v1::$enum::$v),+
            }
        }

        fn $from(value: i32) -> Result<$enum> {
            const FIELD: &str = $field;
            Ok(match known(value, FIELD)? {
                v1::$enum::Unspecified => return unspecified(FIELD),
                $(v1::$enum::$v => $enum::$v),+
            })
        }
    };
}

// ---------------------------------------------------------------------------------------------
// Helpers.

fn required<T>(m: Option<T>, field: &'static str) -> Result<T> {
    m.ok_or(SnapshotError::Missing { field })
}

/// The generated enum for `value`; the caller still turns its `Unspecified` into an error.
fn known<E: TryFrom<i32>>(value: i32, field: &'static str) -> Result<E> {
    E::try_from(value).map_err(|_| SnapshotError::InvalidEnum { field, value })
}

fn unspecified<T>(field: &'static str) -> Result<T> {
    Err(SnapshotError::Unspecified { field })
}

fn to_usize(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

/// A received name as the matching name of `known`, or [`OTHER`].
fn static_name(name: &str, known: &[&'static str]) -> &'static str {
    known.iter().copied().find(|k| *k == name).unwrap_or(OTHER)
}

fn counts_to_proto(m: &BTreeMap<&'static str, u64>) -> HashMap<String, u64> {
    m.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// Counts by the names of `known`; those under other names are added up under [`OTHER`].
fn counts_from_proto(m: HashMap<String, u64>, known: &[&'static str]) -> BTreeMap<&'static str, u64> {
    let mut out = BTreeMap::new();
    for (name, n) in m {
        let v: &mut u64 = out.entry(static_name(&name, known)).or_default();
        *v = v.saturating_add(n);
    }
    out
}

fn non_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

// ---------------------------------------------------------------------------------------------
// The driver ledger.

fn usage_to_proto(u: &Usage) -> v1::Usage {
    // Destructured, so that a new field cannot be left out.
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
    } = *u;
    v1::Usage {
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

fn usage_from_proto(u: Option<v1::Usage>, field: &'static str) -> Result<Usage> {
    let v1::Usage {
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
    } = required(u, field)?;
    Ok(Usage {
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
    })
}

fn driver_to_proto(s: &DriverSnapshot) -> v1::DriverLedger {
    v1::DriverLedger {
        totals: Some(v1::DriverTotals {
            usage: Some(usage_to_proto(&s.totals.usage)),
            processes: s.totals.processes as u64,
            cgroups: s.totals.cgroups as u64,
            live_allocations: s.totals.live_allocations as u64,
            completeness: Some(completeness_to_proto(&s.totals.completeness)),
        }),
        cgroups: s.cgroups.iter().map(driver_cgroup_to_proto).collect(),
        processes: s.processes.iter().map(driver_process_to_proto).collect(),
        gpus: s
            .gpus
            .iter()
            .map(|g| v1::DriverGpu {
                minor: g.minor,
                usage: Some(usage_to_proto(&g.usage)),
                completeness: Some(completeness_to_proto(&g.completeness)),
            })
            .collect(),
        counters: Some(state_counters_to_proto(&s.counters)),
    }
}

fn driver_from_proto(p: v1::DriverLedger) -> Result<DriverSnapshot> {
    let t = required(p.totals, "DriverLedger.totals")?;
    Ok(DriverSnapshot {
        totals: Totals {
            usage: usage_from_proto(t.usage, "DriverTotals.usage")?,
            processes: to_usize(t.processes),
            cgroups: to_usize(t.cgroups),
            live_allocations: to_usize(t.live_allocations),
            completeness: completeness_from_proto(t.completeness),
        },
        cgroups: p.cgroups.into_iter().map(driver_cgroup_from_proto).collect::<Result<_>>()?,
        processes: p.processes.into_iter().map(driver_process_from_proto).collect::<Result<_>>()?,
        gpus: p
            .gpus
            .into_iter()
            .map(|g| {
                Ok(GpuRow {
                    minor: g.minor,
                    usage: usage_from_proto(g.usage, "DriverGpu.usage")?,
                    completeness: completeness_from_proto(g.completeness),
                })
            })
            .collect::<Result<_>>()?,
        counters: state_counters_from_proto(required(p.counters, "DriverLedger.counters")?),
    })
}

fn completeness_to_proto(c: &Completeness) -> v1::LedgerCompleteness {
    v1::LedgerCompleteness {
        from_before_agent: c.from_before_agent,
        records_lost_since_unix_ns: c.records_lost_since_unix_ns,
        nvml_bytes_from_before_agent: c.nvml_bytes_from_before_agent,
    }
}

/// Absent (an older agent): nothing known to be missing.
fn completeness_from_proto(c: Option<v1::LedgerCompleteness>) -> Completeness {
    c.map(|c| Completeness {
        from_before_agent: c.from_before_agent,
        records_lost_since_unix_ns: c.records_lost_since_unix_ns,
        nvml_bytes_from_before_agent: c.nvml_bytes_from_before_agent,
    })
    .unwrap_or_default()
}

fn driver_cgroup_to_proto(c: &CgroupRow) -> v1::DriverCgroup {
    v1::DriverCgroup {
        cgroup_id: c.cgroup_id,
        path: c.path.clone(),
        processes: c.processes as u64,
        removed: c.removed,
        usage: Some(usage_to_proto(&c.usage)),
        completeness: Some(completeness_to_proto(&c.completeness)),
    }
}

fn driver_cgroup_from_proto(c: v1::DriverCgroup) -> Result<CgroupRow> {
    Ok(CgroupRow {
        cgroup_id: c.cgroup_id,
        path: c.path,
        processes: to_usize(c.processes),
        removed: c.removed,
        usage: usage_from_proto(c.usage, "DriverCgroup.usage")?,
        completeness: completeness_from_proto(c.completeness),
    })
}

fn driver_process_to_proto(p: &ProcessRow) -> v1::DriverProcess {
    v1::DriverProcess {
        tgid: p.tgid,
        start_time_ticks: p.start_time_ticks,
        comm: p.comm.clone(),
        cgroup_id: p.cgroup_id,
        fds: p.fds as u64,
        gpu_minors: p.gpu_minors.clone(),
        clients: p.clients as u64,
        handles: p.handles as u64,
        usage: Some(usage_to_proto(&p.usage)),
        completeness: Some(completeness_to_proto(&p.completeness)),
    }
}

fn driver_process_from_proto(p: v1::DriverProcess) -> Result<ProcessRow> {
    Ok(ProcessRow {
        tgid: p.tgid,
        start_time_ticks: p.start_time_ticks,
        comm: p.comm,
        cgroup_id: p.cgroup_id,
        fds: to_usize(p.fds),
        gpu_minors: p.gpu_minors,
        clients: to_usize(p.clients),
        handles: to_usize(p.handles),
        usage: usage_from_proto(p.usage, "DriverProcess.usage")?,
        completeness: completeness_from_proto(p.completeness),
    })
}

fn state_counters_to_proto(c: &StateCounters) -> v1::DriverCounters {
    v1::DriverCounters {
        events: counts_to_proto(&c.events),
        ioctls_by_op: counts_to_proto(&c.ioctls_by_op),
        ioctls_by_device: counts_to_proto(&c.ioctls_by_device),
        failed_by_op: counts_to_proto(&c.failed_by_op),
        rm_control_by_cmd: c.rm_control_by_cmd.iter().map(|(k, v)| (*k, *v)).collect(),
        rm_control_other: c.rm_control_other,
        malformed_by_reason: counts_to_proto(&c.malformed_by_reason),
        uvm_map_external: c.uvm_map_external,
        uvm_unmap_external: c.uvm_unmap_external,
        uvm_free: c.uvm_free,
        allocations: c.allocations,
        frees: c.frees,
        released_by: counts_to_proto(&c.released_by),
        dup_references: c.dup_references,
        dup_unknown_source: c.dup_unknown_source,
        ownership_transfers: c.ownership_transfers,
        implausible_sizes: c.implausible_sizes,
        unknown_handle_frees: c.unknown_handle_frees,
        stale_handles_replaced: c.stale_handles_replaced,
        inferred_gpu_attributions: c.inferred_gpu_attributions,
        unknown_gpu_attributions: c.unknown_gpu_attributions,
        handle_table_full: c.handle_table_full,
        untracked_allocations: c.untracked_allocations,
        fd_table_full: c.fd_table_full,
        unknown_fd_closes: c.unknown_fd_closes,
        stale_fds_replaced: c.stale_fds_replaced,
        managed_table_full: c.managed_table_full,
        unknown_munmaps: c.unknown_munmaps,
        evicted_processes: c.evicted_processes,
        pid_reuse: c.pid_reuse,
        forks: c.forks,
        cgroups_removed: c.cgroups_removed,
        evicted_cgroups: c.evicted_cgroups,
        records_after_exit: c.records_after_exit,
    }
}

fn state_counters_from_proto(c: v1::DriverCounters) -> StateCounters {
    StateCounters {
        events: counts_from_proto(c.events, EVENT_KINDS),
        ioctls_by_op: counts_from_proto(c.ioctls_by_op, IOCTL_OPS),
        ioctls_by_device: counts_from_proto(c.ioctls_by_device, DEVICE_KINDS),
        failed_by_op: counts_from_proto(c.failed_by_op, IOCTL_OPS),
        rm_control_by_cmd: c.rm_control_by_cmd.into_iter().collect(),
        rm_control_other: c.rm_control_other,
        malformed_by_reason: counts_from_proto(
            c.malformed_by_reason,
            &MalformedReason::ALL.map(MalformedReason::as_str),
        ),
        uvm_map_external: c.uvm_map_external,
        uvm_unmap_external: c.uvm_unmap_external,
        uvm_free: c.uvm_free,
        allocations: c.allocations,
        frees: c.frees,
        released_by: counts_from_proto(c.released_by, RELEASE_CAUSES),
        dup_references: c.dup_references,
        dup_unknown_source: c.dup_unknown_source,
        ownership_transfers: c.ownership_transfers,
        implausible_sizes: c.implausible_sizes,
        unknown_handle_frees: c.unknown_handle_frees,
        stale_handles_replaced: c.stale_handles_replaced,
        inferred_gpu_attributions: c.inferred_gpu_attributions,
        unknown_gpu_attributions: c.unknown_gpu_attributions,
        handle_table_full: c.handle_table_full,
        untracked_allocations: c.untracked_allocations,
        fd_table_full: c.fd_table_full,
        unknown_fd_closes: c.unknown_fd_closes,
        stale_fds_replaced: c.stale_fds_replaced,
        managed_table_full: c.managed_table_full,
        unknown_munmaps: c.unknown_munmaps,
        evicted_processes: c.evicted_processes,
        pid_reuse: c.pid_reuse,
        forks: c.forks,
        cgroups_removed: c.cgroups_removed,
        evicted_cgroups: c.evicted_cgroups,
        records_after_exit: c.records_after_exit,
    }
}

// ---------------------------------------------------------------------------------------------
// The CUDA ledger.

fn cuda_usage_to_proto(u: &CudaUsage) -> v1::CudaUsage {
    let CudaUsage {
        device_bytes,
        managed_bytes,
        host_bytes,
        launches,
        graph_launches,
        launch_rate,
        allocs,
        frees,
        failed_allocs,
    } = *u;
    v1::CudaUsage {
        device_bytes,
        managed_bytes,
        host_bytes,
        launches,
        graph_launches,
        launch_rate,
        allocs,
        frees,
        failed_allocs,
    }
}

fn cuda_usage_from_proto(u: Option<v1::CudaUsage>, field: &'static str) -> Result<CudaUsage> {
    let v1::CudaUsage {
        device_bytes,
        managed_bytes,
        host_bytes,
        launches,
        graph_launches,
        launch_rate,
        allocs,
        frees,
        failed_allocs,
    } = required(u, field)?;
    Ok(CudaUsage {
        device_bytes,
        managed_bytes,
        host_bytes,
        launches,
        graph_launches,
        launch_rate,
        allocs,
        frees,
        failed_allocs,
    })
}

fn cuda_to_proto(c: &CudaSnapshot) -> v1::CudaLedger {
    v1::CudaLedger {
        cgroups: c
            .cgroups
            .iter()
            .map(|r| v1::CudaCgroup {
                cgroup_id: r.cgroup_id,
                path: r.path.clone(),
                usage: Some(cuda_usage_to_proto(&r.usage)),
            })
            .collect(),
        processes: c
            .processes
            .iter()
            .map(|r| v1::CudaProcess {
                tgid: r.tgid,
                cgroup_id: r.cgroup_id,
                usage: Some(cuda_usage_to_proto(&r.usage)),
            })
            .collect(),
        totals: Some(cuda_usage_to_proto(&c.totals)),
        calls_by_entry: counts_to_proto(&c.calls_by_entry),
        unknown_frees: c.unknown_frees,
    }
}

fn cuda_from_proto(c: v1::CudaLedger) -> Result<CudaSnapshot> {
    let entries = tracer_common::cuda_entry::ALL.map(|e| e.1);
    Ok(CudaSnapshot {
        cgroups: c
            .cgroups
            .into_iter()
            .map(|r| {
                let usage = cuda_usage_from_proto(r.usage, "CudaCgroup.usage")?;
                Ok(CudaCgroupRow { cgroup_id: r.cgroup_id, path: r.path, usage })
            })
            .collect::<Result<_>>()?,
        processes: c
            .processes
            .into_iter()
            .map(|r| {
                let usage = cuda_usage_from_proto(r.usage, "CudaProcess.usage")?;
                Ok(CudaProcessRow { tgid: r.tgid, cgroup_id: r.cgroup_id, usage })
            })
            .collect::<Result<_>>()?,
        totals: cuda_usage_from_proto(c.totals, "CudaLedger.totals")?,
        calls_by_entry: counts_from_proto(c.calls_by_entry, &entries),
        unknown_frees: c.unknown_frees,
    })
}

fn ledger_check_to_proto(l: &LedgerCheck) -> v1::LedgerCheck {
    v1::LedgerCheck {
        tgid: l.tgid,
        cgroup_id: l.cgroup_id,
        cuda_device_bytes: l.cuda_device_bytes,
        driver_vidmem_bytes: l.driver_vidmem_bytes,
        driver_minus_cuda: l.driver_minus_cuda,
    }
}

fn ledger_check_from_proto(l: v1::LedgerCheck) -> LedgerCheck {
    LedgerCheck {
        tgid: l.tgid,
        cgroup_id: l.cgroup_id,
        cuda_device_bytes: l.cuda_device_bytes,
        driver_vidmem_bytes: l.driver_vidmem_bytes,
        driver_minus_cuda: l.driver_minus_cuda,
    }
}

// ---------------------------------------------------------------------------------------------
// Counters and accounting.

fn probe_counters_to_proto(name: &str, c: &ProbeCounters) -> v1::ProbeCounters {
    v1::ProbeCounters {
        probe: name.to_string(),
        seen: c.seen,
        emitted: c.emitted,
        aggregated: c.aggregated,
        dropped_by_reason: c.drops().map(|(reason, n)| (reason.to_string(), n)).collect(),
    }
}

/// A reason this build does not know has no slot: its drops are not counted (see the module docs).
fn probe_counters_from_proto(p: v1::ProbeCounters) -> (String, ProbeCounters) {
    let mut c = ProbeCounters { seen: p.seen, emitted: p.emitted, aggregated: p.aggregated, ..Default::default() };
    for (reason, n) in p.dropped_by_reason {
        if let Some(i) = drop_reasons().iter().position(|r| *r == reason) {
            c.dropped_by_reason[i] = n;
        }
    }
    (p.probe, c)
}

fn pipeline_to_proto(p: &PipelineStats) -> v1::PipelineStats {
    v1::PipelineStats {
        received: p.received,
        decoded: p.decoded,
        decode_errors: counts_to_proto(&p.decode_errors),
        seeded_fds: p.seeded_fds,
        scan_unreadable: p.scan_unreadable,
        scan_not_devices: p.scan_not_devices,
        processes_reconciled: p.processes_reconciled,
        lost_records_untracked: p.lost_records_untracked,
        fd_map_cleanups: p.fd_map_cleanups,
        fd_map_errors: p.fd_map_errors,
        inflight_swept: p.inflight_swept,
        cuda_libraries_found: p.cuda_libraries_found,
        cuda_library_errors: p.cuda_library_errors,
        cuda_libraries_detached: p.cuda_libraries_detached,
        cgroup_paths_by_id: p.cgroup_paths_by_id,
        cgroup_paths_by_walk: p.cgroup_paths_by_walk,
        cgroup_paths_unresolved: p.cgroup_paths_unresolved,
        cgroup_walks: p.cgroup_walks,
    }
}

fn pipeline_from_proto(p: v1::PipelineStats) -> PipelineStats {
    PipelineStats {
        received: p.received,
        decoded: p.decoded,
        decode_errors: counts_from_proto(p.decode_errors, DECODE_ERROR_REASONS),
        seeded_fds: p.seeded_fds,
        scan_unreadable: p.scan_unreadable,
        scan_not_devices: p.scan_not_devices,
        processes_reconciled: p.processes_reconciled,
        lost_records_untracked: p.lost_records_untracked,
        fd_map_cleanups: p.fd_map_cleanups,
        fd_map_errors: p.fd_map_errors,
        inflight_swept: p.inflight_swept,
        cuda_libraries_found: p.cuda_libraries_found,
        cuda_library_errors: p.cuda_library_errors,
        cuda_libraries_detached: p.cuda_libraries_detached,
        cgroup_paths_by_id: p.cgroup_paths_by_id,
        cgroup_paths_by_walk: p.cgroup_paths_by_walk,
        cgroup_paths_unresolved: p.cgroup_paths_unresolved,
        cgroup_walks: p.cgroup_walks,
    }
}

fn accounting_to_proto(a: &Accounting) -> v1::Accounting {
    v1::Accounting {
        seen: a.seen,
        received: a.received,
        aggregated: a.aggregated,
        dropped: a.dropped,
        in_flight: a.in_flight,
        exact: a.exact,
    }
}

fn accounting_from_proto(a: v1::Accounting) -> Accounting {
    Accounting {
        seen: a.seen,
        received: a.received,
        aggregated: a.aggregated,
        dropped: a.dropped,
        in_flight: a.in_flight,
        exact: a.exact,
    }
}

fn attach_mode_to_proto(m: ProbeMode) -> v1::AttachMode {
    match m {
        ProbeMode::NvmlOnly => v1::AttachMode::NvmlOnly,
        ProbeMode::Attached(AttachMode::Auto) => v1::AttachMode::Auto,
        ProbeMode::Attached(AttachMode::DriverEntry) => v1::AttachMode::DriverEntry,
        ProbeMode::Attached(AttachMode::BtfTracepoint) => v1::AttachMode::BtfTracepoint,
        ProbeMode::Attached(AttachMode::RawTracepoint) => v1::AttachMode::RawTracepoint,
        ProbeMode::Attached(AttachMode::SyscallTracepoint) => v1::AttachMode::SyscallTracepoint,
    }
}

fn attach_mode_from_proto(value: i32, field: &'static str) -> Result<ProbeMode> {
    Ok(match known(value, field)? {
        v1::AttachMode::Unspecified => return unspecified(field),
        v1::AttachMode::NvmlOnly => ProbeMode::NvmlOnly,
        v1::AttachMode::Auto => ProbeMode::Attached(AttachMode::Auto),
        v1::AttachMode::DriverEntry => ProbeMode::Attached(AttachMode::DriverEntry),
        v1::AttachMode::BtfTracepoint => ProbeMode::Attached(AttachMode::BtfTracepoint),
        v1::AttachMode::RawTracepoint => ProbeMode::Attached(AttachMode::RawTracepoint),
        v1::AttachMode::SyscallTracepoint => ProbeMode::Attached(AttachMode::SyscallTracepoint),
    })
}

// ---------------------------------------------------------------------------------------------
// NVML.

enum_pair!(
    nvml_status_to_proto,
    nvml_status_from_proto,
    NvmlStatus,
    "NvmlView.status",
    [NotStarted, Ready, Unavailable, Off]
);

fn nvml_to_proto(n: &NvmlView) -> v1::NvmlView {
    v1::NvmlView {
        status: nvml_status_to_proto(n.status).into(),
        reason: n.reason.clone(),
        library: n.library.clone(),
        driver_version: n.driver_version.clone(),
        nvml_version: n.nvml_version.clone(),
        failed_readings: counts_to_proto(&n.failed_readings),
        samples: n.samples,
        sample: n.sample.as_deref().map(nvml_sample_to_proto),
    }
}

fn nvml_from_proto(n: v1::NvmlView) -> Result<NvmlView> {
    Ok(NvmlView {
        status: nvml_status_from_proto(n.status)?,
        reason: n.reason,
        library: n.library,
        driver_version: n.driver_version,
        nvml_version: n.nvml_version,
        failed_readings: counts_from_proto(n.failed_readings, NVML_FAILURE_REASONS),
        samples: n.samples,
        sample: n.sample.map(nvml_sample_from_proto).map(Arc::new),
    })
}

fn missing_to_proto(m: &[Missing]) -> Vec<v1::MissingReading> {
    m.iter().map(|m| v1::MissingReading { what: m.what.clone(), reason: m.reason.clone() }).collect()
}

fn missing_from_proto(m: Vec<v1::MissingReading>) -> Vec<Missing> {
    m.into_iter().map(|m| Missing { what: m.what, reason: m.reason }).collect()
}

fn memory_to_proto(m: &MemoryInfo) -> v1::DeviceMemory {
    v1::DeviceMemory { total_bytes: m.total, reserved_bytes: m.reserved, free_bytes: m.free, used_bytes: m.used }
}

fn memory_from_proto(m: v1::DeviceMemory) -> MemoryInfo {
    MemoryInfo { total: m.total_bytes, reserved: m.reserved_bytes, free: m.free_bytes, used: m.used_bytes }
}

fn nvml_sample_to_proto(s: &NvmlSample) -> v1::NvmlSample {
    v1::NvmlSample {
        taken_unix_ns: s.taken_unix_ns,
        driver_version: s.driver_version.clone(),
        nvml_version: s.nvml_version.clone(),
        cuda_driver_version: s.cuda_driver_version,
        gpus: s.devices.iter().map(nvml_gpu_to_proto).collect(),
        cost_ns: s.cost_ns,
        missing: missing_to_proto(&s.missing),
    }
}

fn nvml_sample_from_proto(s: v1::NvmlSample) -> NvmlSample {
    NvmlSample {
        taken_unix_ns: s.taken_unix_ns,
        taken_mono_ns: 0,
        driver_version: s.driver_version,
        nvml_version: s.nvml_version,
        cuda_driver_version: s.cuda_driver_version,
        devices: s.gpus.into_iter().map(nvml_gpu_from_proto).collect(),
        missing: missing_from_proto(s.missing),
        cost_ns: s.cost_ns,
    }
}

fn nvml_gpu_to_proto(d: &DeviceSample) -> v1::NvmlGpu {
    v1::NvmlGpu {
        index: d.index,
        uuid: d.uuid.clone(),
        name: d.name.clone(),
        minor: d.minor,
        pci_bus_id: d.pci_bus_id.clone(),
        memory: d.memory.as_ref().map(memory_to_proto),
        utilization: d.utilization.map(|u| v1::GpuUtilization { gpu_pct: u.gpu_pct, memory_pct: u.memory_pct }),
        power_mw: d.power_mw,
        energy_mj: d.energy_mj,
        mig_enabled: d.mig_enabled,
        mig_devices: d.mig_instances.iter().map(mig_device_to_proto).collect(),
        lost: d.lost,
        missing: missing_to_proto(&d.missing),
    }
}

fn nvml_gpu_from_proto(d: v1::NvmlGpu) -> DeviceSample {
    DeviceSample {
        index: d.index,
        uuid: d.uuid,
        name: d.name,
        minor: d.minor,
        pci_bus_id: d.pci_bus_id,
        memory: d.memory.map(memory_from_proto),
        utilization: d.utilization.map(|u| Utilization { gpu_pct: u.gpu_pct, memory_pct: u.memory_pct }),
        power_mw: d.power_mw,
        energy_mj: d.energy_mj,
        mig_enabled: d.mig_enabled,
        mig_instances: d.mig_devices.into_iter().map(mig_device_from_proto).collect(),
        lost: d.lost,
        missing: missing_from_proto(d.missing),
        ..Default::default()
    }
}

fn mig_device_to_proto(m: &MigInstance) -> v1::NvmlMigDevice {
    v1::NvmlMigDevice {
        index: m.index,
        uuid: m.uuid.clone(),
        gpu_instance_id: m.gpu_instance_id,
        compute_instance_id: m.compute_instance_id,
        name: m.name.clone(),
        memory: m.memory.as_ref().map(memory_to_proto),
    }
}

fn mig_device_from_proto(m: v1::NvmlMigDevice) -> MigInstance {
    MigInstance {
        index: m.index,
        uuid: m.uuid,
        gpu_instance_id: m.gpu_instance_id,
        compute_instance_id: m.compute_instance_id,
        name: m.name,
        memory: m.memory.map(memory_from_proto),
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------------------------
// Attribution.

fn attribution_to_proto(a: &AttributionSnapshot) -> v1::Attribution {
    v1::Attribution {
        start_unix_ns: a.start_unix_ns,
        interval_ns: a.interval_ns,
        price_per_gpu_hour: a.price_per_gpu_hour,
        gpus: a.gpus.iter().map(gpu_attribution_to_proto).collect(),
        containers: a.containers.iter().map(summary_to_proto).collect(),
        bill: Some(bill_to_proto(&a.bill)),
        counters: Some(attributor_counters_to_proto(&a.counters)),
    }
}

fn attribution_from_proto(a: v1::Attribution) -> Result<AttributionSnapshot> {
    Ok(AttributionSnapshot {
        start_unix_ns: a.start_unix_ns,
        interval_ns: a.interval_ns,
        price_per_gpu_hour: a.price_per_gpu_hour,
        gpus: a.gpus.into_iter().map(gpu_attribution_from_proto).collect::<Result<_>>()?,
        containers: a.containers.into_iter().map(summary_from_proto).collect::<Result<_>>()?,
        bill: bill_from_proto(required(a.bill, "Attribution.bill")?),
        counters: attributor_counters_from_proto(required(a.counters, "Attribution.counters")?),
    })
}

fn bill_to_proto(b: &Bill) -> v1::Bill {
    v1::Bill {
        total: b.total,
        idle: b.idle,
        driver_reserved: b.driver_reserved,
        unattributed: b.unattributed,
        evicted: b.evicted,
    }
}

fn bill_from_proto(b: v1::Bill) -> Bill {
    Bill {
        total: b.total,
        idle: b.idle,
        driver_reserved: b.driver_reserved,
        unattributed: b.unattributed,
        evicted: b.evicted,
    }
}

fn attributor_counters_to_proto(c: &AttributorCounters) -> v1::AttributorCounters {
    v1::AttributorCounters {
        intervals: c.intervals,
        evicted_containers: c.evicted_containers,
        evicted_gpus: c.evicted_gpus,
        dropped_gpus: c.dropped_gpus,
        invalid_price: c.invalid_price,
    }
}

fn attributor_counters_from_proto(c: v1::AttributorCounters) -> AttributorCounters {
    AttributorCounters {
        intervals: c.intervals,
        evicted_containers: c.evicted_containers,
        evicted_gpus: c.evicted_gpus,
        dropped_gpus: c.dropped_gpus,
        invalid_price: c.invalid_price,
    }
}

fn gpu_attribution_to_proto(g: &GpuAttribution) -> v1::GpuAttribution {
    v1::GpuAttribution {
        uuid: g.uuid.clone(),
        parent_uuid: g.parent_uuid.clone(),
        index: g.index,
        name: g.name.clone(),
        minor: g.minor,
        mig_profile: g.mig_profile.clone(),
        sharing: sharing_to_proto(g.sharing).into(),
        sharing_reason: g.sharing_reason.clone(),
        lost: g.lost,
        containers: g.containers.iter().map(line_to_proto).collect(),
        memory: g.memory.as_ref().map(memory_lines_to_proto),
        compute: Some(compute_lines_to_proto(&g.compute)),
        energy: g.energy.as_ref().map(energy_lines_to_proto),
        cost: g.cost.as_ref().map(cost_lines_to_proto),
    }
}

fn gpu_attribution_from_proto(g: v1::GpuAttribution) -> Result<GpuAttribution> {
    Ok(GpuAttribution {
        uuid: g.uuid,
        parent_uuid: g.parent_uuid,
        index: g.index,
        name: g.name,
        minor: g.minor,
        mig_profile: g.mig_profile,
        sharing: sharing_from_proto(g.sharing)?,
        sharing_reason: g.sharing_reason,
        lost: g.lost,
        containers: g.containers.into_iter().map(line_from_proto).collect::<Result<_>>()?,
        memory: g.memory.map(memory_lines_from_proto),
        compute: compute_lines_from_proto(required(g.compute, "GpuAttribution.compute")?)?,
        energy: g.energy.map(energy_lines_from_proto).transpose()?,
        cost: g.cost.map(cost_lines_from_proto).transpose()?,
    })
}

enum_pair!(
    sharing_to_proto,
    sharing_from_proto,
    SharingMode,
    "GpuAttribution.sharing",
    [Exclusive, TimeSlicing, Mps, Mig, Unknown]
);

fn line_to_proto(l: &ContainerLine) -> v1::ContainerLine {
    v1::ContainerLine {
        cgroup_id: l.container.0,
        name: l.name.clone(),
        pids: l.pids.clone(),
        memory_bytes: l.memory_bytes,
        memory_source: memory_source_to_proto(l.memory_source).into(),
        driver_ledger_bytes: l.ledgers.driver_bytes,
        cuda_allocated_bytes: l.ledgers.cuda_allocated_bytes,
        non_cuda_bytes: l.ledgers.non_cuda_bytes,
        sm_millipct: l.sm_millipct,
        launches: l.launches,
        energy_mj: l.energy_mj,
        cost_nano: l.cost_nano,
    }
}

fn line_from_proto(l: v1::ContainerLine) -> Result<ContainerLine> {
    Ok(ContainerLine {
        container: ContainerKey(l.cgroup_id),
        name: l.name,
        pids: l.pids,
        memory_bytes: l.memory_bytes,
        memory_source: memory_source_from_proto(l.memory_source)?,
        ledgers: LedgerSplit {
            driver_bytes: l.driver_ledger_bytes,
            cuda_allocated_bytes: l.cuda_allocated_bytes,
            non_cuda_bytes: l.non_cuda_bytes,
        },
        sm_millipct: l.sm_millipct,
        launches: l.launches,
        energy_mj: l.energy_mj,
        cost_nano: l.cost_nano,
    })
}

enum_pair!(
    memory_source_to_proto,
    memory_source_from_proto,
    MemorySource,
    "ContainerLine.memory_source",
    [Nvml, DriverLedger, Mixed, None]
);

fn memory_lines_to_proto(m: &MemoryLines) -> v1::MemoryLines {
    v1::MemoryLines {
        total: m.total,
        driver_reserved: m.driver_reserved,
        unattributed: m.unattributed,
        unattributed_host_processes: m.unattributed_detail.host_processes,
        unattributed_mps_server: m.unattributed_detail.mps_server,
        unattributed_other: m.unattributed_detail.other,
        free: m.free,
        scaled_down: m.scaled_down,
        inconsistent: m.inconsistent,
    }
}

fn memory_lines_from_proto(m: v1::MemoryLines) -> MemoryLines {
    MemoryLines {
        total: m.total,
        driver_reserved: m.driver_reserved,
        unattributed: m.unattributed,
        unattributed_detail: UnattributedMemory {
            host_processes: m.unattributed_host_processes,
            mps_server: m.unattributed_mps_server,
            other: m.unattributed_other,
        },
        free: m.free,
        scaled_down: m.scaled_down,
        inconsistent: m.inconsistent,
    }
}

fn compute_lines_to_proto(c: &ComputeLines) -> v1::ComputeLines {
    let method = match c.method {
        ComputeMethod::ProcessSamples => v1::ComputeMethod::ProcessSamples,
        ComputeMethod::LaunchCounts => v1::ComputeMethod::LaunchCounts,
        ComputeMethod::None => v1::ComputeMethod::None,
    };
    v1::ComputeLines {
        method: method.into(),
        unattributed: c.unattributed,
        idle: c.idle,
        device_activity_pct: c.device_activity_pct,
        clamped: c.clamped,
    }
}

fn compute_lines_from_proto(c: v1::ComputeLines) -> Result<ComputeLines> {
    const FIELD: &str = "ComputeLines.method";
    let method = match known(c.method, FIELD)? {
        v1::ComputeMethod::Unspecified => return unspecified(FIELD),
        v1::ComputeMethod::ProcessSamples => ComputeMethod::ProcessSamples,
        v1::ComputeMethod::LaunchCounts => ComputeMethod::LaunchCounts,
        v1::ComputeMethod::None => ComputeMethod::None,
    };
    Ok(ComputeLines {
        method,
        unattributed: c.unattributed,
        idle: c.idle,
        device_activity_pct: c.device_activity_pct,
        clamped: c.clamped,
    })
}

fn energy_lines_to_proto(e: &EnergyLines) -> v1::EnergyLines {
    let source = match e.source {
        EnergySource::Counter => v1::EnergySource::Counter,
        EnergySource::CounterReset => v1::EnergySource::CounterReset,
        EnergySource::PowerTimesInterval => v1::EnergySource::PowerTimesInterval,
        EnergySource::ParentShare => v1::EnergySource::ParentShare,
    };
    v1::EnergyLines { delta_mj: e.delta_mj, source: source.into(), unattributed: e.unattributed, idle: e.idle }
}

fn energy_lines_from_proto(e: v1::EnergyLines) -> Result<EnergyLines> {
    const FIELD: &str = "EnergyLines.source";
    let source = match known(e.source, FIELD)? {
        v1::EnergySource::Unspecified => return unspecified(FIELD),
        v1::EnergySource::Counter => EnergySource::Counter,
        v1::EnergySource::CounterReset => EnergySource::CounterReset,
        v1::EnergySource::PowerTimesInterval => EnergySource::PowerTimesInterval,
        v1::EnergySource::ParentShare => EnergySource::ParentShare,
    };
    Ok(EnergyLines { delta_mj: e.delta_mj, source, unattributed: e.unattributed, idle: e.idle })
}

fn cost_lines_to_proto(c: &CostLines) -> v1::CostLines {
    v1::CostLines {
        price_nano: c.price_nano,
        policy: cost_policy_to_proto(c.policy).into(),
        basis: cost_basis_to_proto(c.basis).into(),
        unused: match c.unused {
            UnusedCost::Lines => v1::UnusedCost::Lines,
            UnusedCost::Spread => v1::UnusedCost::Spread,
        }
        .into(),
        idle: c.idle,
        driver_reserved: c.driver_reserved,
        unattributed: c.unattributed,
    }
}

fn cost_lines_from_proto(c: v1::CostLines) -> Result<CostLines> {
    const UNUSED: &str = "CostLines.unused";
    let unused = match known(c.unused, UNUSED)? {
        v1::UnusedCost::Unspecified => return unspecified(UNUSED),
        v1::UnusedCost::Lines => UnusedCost::Lines,
        v1::UnusedCost::Spread => UnusedCost::Spread,
    };
    Ok(CostLines {
        price_nano: c.price_nano,
        policy: cost_policy_from_proto(c.policy)?,
        basis: cost_basis_from_proto(c.basis)?,
        unused,
        idle: c.idle,
        driver_reserved: c.driver_reserved,
        unattributed: c.unattributed,
    })
}

enum_pair!(
    cost_policy_to_proto,
    cost_policy_from_proto,
    CostPolicy,
    "CostLines.policy",
    [MemoryTime, ComputeTime, Blended, RequestBased]
);

enum_pair!(
    cost_basis_to_proto,
    cost_basis_from_proto,
    CostBasis,
    "CostLines.basis",
    [MemoryTime, ComputeTime, Blended, RequestBased, Nothing]
);

fn summary_to_proto(c: &ContainerSummary) -> v1::ContainerSummary {
    v1::ContainerSummary {
        cgroup_id: c.container.0,
        name: c.name.clone(),
        gpus: c.gpus.clone(),
        memory_bytes: c.memory_bytes,
        sm_millipct: c.sm_millipct,
        launches: c.launches,
        energy_mj: c.energy_mj,
        cost_nano: c.cost_nano,
        cumulative_cost_nano: c.cumulative_cost_nano,
        cumulative_energy_mj: c.cumulative_energy_mj,
        last_seen_unix_ns: c.last_seen_unix_ns,
        idle_reservation: c
            .idle_reservation
            .map(|r| v1::IdleReservation { since_unix_ns: r.since_unix_ns, held_bytes: r.held_bytes }),
        rightsizing: c.rightsizing.as_ref().map(rightsizing_to_proto),
    }
}

fn summary_from_proto(c: v1::ContainerSummary) -> Result<ContainerSummary> {
    Ok(ContainerSummary {
        container: ContainerKey(c.cgroup_id),
        name: c.name,
        gpus: c.gpus,
        memory_bytes: c.memory_bytes,
        sm_millipct: c.sm_millipct,
        launches: c.launches,
        energy_mj: c.energy_mj,
        cost_nano: c.cost_nano,
        cumulative_cost_nano: c.cumulative_cost_nano,
        cumulative_energy_mj: c.cumulative_energy_mj,
        last_seen_unix_ns: c.last_seen_unix_ns,
        idle_reservation: c
            .idle_reservation
            .map(|r| IdleReservation { since_unix_ns: r.since_unix_ns, held_bytes: r.held_bytes }),
        rightsizing: c.rightsizing.map(rightsizing_from_proto).transpose()?,
    })
}

fn rightsizing_to_proto(r: &Rightsizing) -> v1::Rightsizing {
    v1::Rightsizing {
        covered_s: r.covered_s,
        samples: r.samples as u64,
        peak_memory_bytes: r.peak_memory_bytes,
        p95_memory_bytes: r.p95_memory_bytes,
        peak_sm_millipct: r.peak_sm_millipct,
        p95_sm_millipct: r.p95_sm_millipct,
        gpu_total_bytes: r.gpu_total_bytes,
        request: r.request.as_ref().map(request_to_proto),
        fit: Some(fit_to_proto(&r.fit)),
        over_requested: r.over_requested,
    }
}

fn rightsizing_from_proto(r: v1::Rightsizing) -> Result<Rightsizing> {
    Ok(Rightsizing {
        covered_s: r.covered_s,
        samples: to_usize(r.samples),
        peak_memory_bytes: r.peak_memory_bytes,
        p95_memory_bytes: r.p95_memory_bytes,
        peak_sm_millipct: r.peak_sm_millipct,
        p95_sm_millipct: r.p95_sm_millipct,
        gpu_total_bytes: r.gpu_total_bytes,
        request: r.request.map(request_from_proto).transpose()?,
        fit: fit_from_proto(required(r.fit, "Rightsizing.fit")?)?,
        over_requested: r.over_requested,
    })
}

fn request_to_proto(r: &GpuRequest) -> v1::GpuRequest {
    use v1::gpu_request::Request;
    let request = match r {
        GpuRequest::WholeGpus { count } => Request::WholeGpus(v1::WholeGpus { count: *count }),
        GpuRequest::MigProfile { profile, count } => {
            Request::MigProfile(v1::MigProfileRequest { profile: profile.clone(), count: *count })
        }
        GpuRequest::Fraction { fraction } => Request::Fraction(*fraction),
    };
    v1::GpuRequest { request: Some(request) }
}

fn request_from_proto(r: v1::GpuRequest) -> Result<GpuRequest> {
    use v1::gpu_request::Request;
    Ok(match required(r.request, "GpuRequest.request")? {
        Request::WholeGpus(w) => GpuRequest::WholeGpus { count: w.count },
        Request::MigProfile(m) => GpuRequest::MigProfile { profile: m.profile, count: m.count },
        Request::Fraction(fraction) => GpuRequest::Fraction { fraction },
    })
}

fn fit_to_proto(f: &Fit) -> v1::Fit {
    use v1::fit::Fit as P;
    let fit = match f {
        Fit::MigProfile { profile } => P::MigProfile(profile.clone()),
        Fit::Fraction { pct } => P::FractionPct(*pct),
        Fit::WholeGpu => P::WholeGpu(v1::WholeGpu {}),
    };
    v1::Fit { fit: Some(fit) }
}

fn fit_from_proto(f: v1::Fit) -> Result<Fit> {
    use v1::fit::Fit as P;
    Ok(match required(f.fit, "Fit.fit")? {
        P::MigProfile(profile) => Fit::MigProfile { profile },
        P::FractionPct(pct) => Fit::Fraction { pct },
        P::WholeGpu(v1::WholeGpu {}) => Fit::WholeGpu,
    })
}

// ---------------------------------------------------------------------------------------------
// Identity, allocations, guardrails, Kubernetes.

fn container_to_proto(cgroup_id: u64, c: &ContainerIdentity) -> v1::Container {
    v1::Container {
        cgroup_id,
        cgroup_path: c.cgroup_path.clone(),
        identity: Some(container_proto(c)),
        gpu_requests: c.gpu_requests.iter().map(|(k, v)| (k.clone(), *v)).collect(),
    }
}

/// `(cgroup id, identity)`; names outside the known kinds, runtimes and QoS classes become
/// [`OTHER`], empty strings `None`.
fn container_from_proto(c: v1::Container) -> Result<(u64, ContainerIdentity)> {
    let id = required(c.identity, "Container.identity")?;
    let identity = ContainerIdentity {
        cgroup_id: c.cgroup_id,
        cgroup_path: c.cgroup_path,
        kind: static_name(&id.kind, CONTAINER_KINDS),
        runtime: (!id.runtime.is_empty()).then(|| static_name(&id.runtime, RUNTIMES)),
        container_id: non_empty(id.container_id),
        pod_uid: non_empty(id.pod_uid),
        qos: (!id.qos.is_empty()).then(|| static_name(&id.qos, QOS_CLASSES)),
        namespace: non_empty(id.namespace),
        pod: non_empty(id.pod),
        container: non_empty(id.container),
        owner_kind: non_empty(id.owner_kind),
        owner_name: non_empty(id.owner_name),
        labels: id.labels.into_iter().collect(),
        gpu_requests: c.gpu_requests.into_iter().collect(),
        allocated_gpus: id.allocated_gpus,
        allocations_known: id.allocations_known,
    };
    Ok((c.cgroup_id, identity))
}

fn allocation_use_to_proto(a: &AllocationUse) -> v1::AllocationUse {
    v1::AllocationUse {
        cgroup_id: a.cgroup_id,
        name: a.name.clone(),
        allocated: a.allocated.clone(),
        allocated_gpus: a.allocated_gpus.clone(),
        used_gpus: a.used_gpus.clone(),
        outside_allocation: a.outside_allocation.clone(),
    }
}

fn allocation_use_from_proto(a: v1::AllocationUse) -> AllocationUse {
    AllocationUse {
        cgroup_id: a.cgroup_id,
        name: a.name,
        allocated: a.allocated,
        allocated_gpus: a.allocated_gpus,
        used_gpus: a.used_gpus,
        outside_allocation: a.outside_allocation,
    }
}

fn violation_to_proto(v: &Violation) -> v1::RaisedViolation {
    let g = v.gpu.clone().unwrap_or_default();
    let e = &v.evidence;
    let violation = v1::Violation {
        kind: v.kind.as_str().into(),
        namespace: v.namespace.clone(),
        pod: v.pod.clone(),
        container: v.container.clone(),
        gpu_uuid: g.uuid.unwrap_or_default(),
        gpu_minor: g.minor,
        gpu_index: g.index,
        mig_uuid: g.mig_uuid.unwrap_or_default(),
        device_path: e.device_path.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
        nvml_uuid: e.nvml_uuid.clone().unwrap_or_default(),
        nvidia_visible_devices: e.visible_devices.nvidia.clone(),
        cuda_visible_devices: e.visible_devices.cuda.clone(),
        allocated: e.allocated.clone(),
    };
    v1::RaisedViolation { violation: Some(violation), pid: v.pid }
}

fn violation_from_proto(r: v1::RaisedViolation) -> Result<Violation> {
    let v = required(r.violation, "RaisedViolation.violation")?;
    let kind = ViolationKind::ALL
        .into_iter()
        .find(|k| k.as_str() == v.kind)
        .ok_or_else(|| SnapshotError::UnknownName { field: "Violation.kind", value: v.kind.clone() })?;
    let gpu =
        GpuRef { uuid: non_empty(v.gpu_uuid), minor: v.gpu_minor, index: v.gpu_index, mig_uuid: non_empty(v.mig_uuid) };
    Ok(Violation {
        kind,
        namespace: v.namespace,
        pod: v.pod,
        container: v.container,
        pid: r.pid,
        gpu: (gpu != GpuRef::default()).then_some(gpu),
        evidence: Evidence {
            device_path: non_empty(v.device_path).map(PathBuf::from),
            nvml_uuid: non_empty(v.nvml_uuid),
            visible_devices: VisibleDevices { nvidia: v.nvidia_visible_devices, cuda: v.cuda_visible_devices },
            allocated: v.allocated,
        },
    })
}

fn violation_counts_to_proto(c: &ViolationCounts) -> v1::ViolationCounts {
    v1::ViolationCounts {
        unallocated_gpu_open: c.unallocated_gpu_open,
        unallocated_gpu_in_nvml: c.unallocated_gpu_in_nvml,
        gpu_use_without_allocation: c.gpu_use_without_allocation,
        visible_devices_all_without_request: c.visible_devices_all_without_request,
        unresolved: c.unresolved,
    }
}

fn violation_counts_from_proto(c: v1::ViolationCounts) -> ViolationCounts {
    ViolationCounts {
        unallocated_gpu_open: c.unallocated_gpu_open,
        unallocated_gpu_in_nvml: c.unallocated_gpu_in_nvml,
        gpu_use_without_allocation: c.gpu_use_without_allocation,
        visible_devices_all_without_request: c.visible_devices_all_without_request,
        unresolved: c.unresolved,
    }
}

enum_pair!(
    kube_status_to_proto,
    kube_status_from_proto,
    KubernetesStatus,
    "KubernetesView.status",
    [NotStarted, Running, NotInUse, Unavailable, Off]
);

fn kube_to_proto(k: &KubeView) -> v1::KubernetesView {
    v1::KubernetesView {
        status: kube_status_to_proto(k.status).into(),
        detail: k.detail.clone(),
        watcher: k.watcher.as_ref().map(watcher_to_proto),
        pod_resources: k.pod_resources.as_ref().map(pod_resources_to_proto),
    }
}

fn kube_from_proto(k: v1::KubernetesView) -> Result<KubeView> {
    Ok(KubeView {
        status: kube_status_from_proto(k.status)?,
        detail: k.detail,
        watcher: k.watcher.map(watcher_from_proto),
        pod_resources: k.pod_resources.map(pod_resources_from_proto),
    })
}

fn watcher_to_proto(w: &KubeStatus) -> v1::PodWatcher {
    v1::PodWatcher {
        node: w.node.clone(),
        server: w.server.clone(),
        connected: w.connected,
        ready: w.ready,
        last_error: w.last_error.clone(),
        errors: w.errors,
        relists: w.relists,
        pods_cached: w.pods_cached as u64,
        dra_discovered: w.dra_versions.is_some(),
        dra_versions: w.dra_versions.clone().unwrap_or_default(),
    }
}

fn watcher_from_proto(w: v1::PodWatcher) -> KubeStatus {
    KubeStatus {
        node: w.node,
        server: w.server,
        connected: w.connected,
        ready: w.ready,
        last_error: w.last_error,
        errors: w.errors,
        relists: w.relists,
        pods_cached: to_usize(w.pods_cached),
        dra_versions: w.dra_discovered.then_some(w.dra_versions),
    }
}

fn pod_resources_to_proto(a: &AllocationStatus) -> v1::PodResourcesPoller {
    v1::PodResourcesPoller {
        socket: a.socket.display().to_string(),
        available: a.available,
        last_success_unix_ns: a.last_success_unix_ns,
        last_error: a.last_error.clone(),
        allocatable_error: a.allocatable_error.clone(),
        refreshes: a.refreshes,
        failures: a.failures,
    }
}

fn pod_resources_from_proto(a: v1::PodResourcesPoller) -> AllocationStatus {
    AllocationStatus {
        socket: PathBuf::from(a.socket),
        available: a.available,
        last_success_unix_ns: a.last_success_unix_ns,
        last_error: a.last_error,
        allocatable_error: a.allocatable_error,
        refreshes: a.refreshes,
        failures: a.failures,
    }
}

// ---------------------------------------------------------------------------------------------
// Status.

fn family_to_proto(f: &FamilyStatus) -> v1::ProbeFamily {
    let (state, programs, error) = match f {
        FamilyStatus::Attached { programs } => (v1::FamilyState::Attached, programs.clone(), String::new()),
        FamilyStatus::Disabled => (v1::FamilyState::Disabled, Vec::new(), String::new()),
        FamilyStatus::Failed { error } => (v1::FamilyState::Failed, Vec::new(), error.clone()),
        FamilyStatus::NothingToProbe { error } => (v1::FamilyState::NothingToProbe, Vec::new(), error.clone()),
    };
    v1::ProbeFamily { state: state.into(), programs, error }
}

fn library_to_proto(l: &LibraryReport) -> v1::CudaLibrary {
    v1::CudaLibrary {
        path: l.path.clone(),
        inode: l.inode,
        method: l.method.as_str().into(),
        method_detail: l.method_detail.clone(),
        uprobes: l.uprobes as u32,
        links: l.links as u32,
        entries: l
            .entries
            .iter()
            .map(|e| v1::CudaEntryPoint { symbol: e.symbol.into(), status: e.status.into(), detail: e.detail.clone() })
            .collect(),
    }
}

fn kernel_features_to_proto(f: &KernelFeatures) -> v1::KernelFeatures {
    v1::KernelFeatures {
        release: f.release.clone(),
        btf: f.btf,
        tracefs: f.tracefs,
        kprobes: f.kprobes,
        nvidia_module: f.nvidia_module,
        syscall_tracepoints: f.syscall_tracepoints,
    }
}

#[cfg(test)]
mod tests;
