//! Counters: the kernel's per-probe counters, the user-space pipeline's, the end-to-end
//! accounting, and where the probes attached.
use gpu_tracer_proto::v1;

use crate::{
    config::AttachMode,
    model::{
        Accounting, PipelineStats,
        counters::{ProbeCounters, drop_reasons},
        probes::ProbeMode,
    },
};

use super::{
    Result,
    codec::{Counts, FromProto, ToProto, WireEnum, known, unspecified, wire_message},
};

/// `decode::DecodeError::reason` (`PipelineStats::decode_errors`); keep it in step (a test checks).
pub(super) const DECODE_ERROR_REASONS: &[&str] = &["short", "unknown_kind", "bad_record_size", "bad_length"];

/// One probe's counters, by the probe's name (`KernelCounters::probes`).
impl ToProto for (String, ProbeCounters) {
    type Proto = v1::ProbeCounters;

    fn to_proto(&self) -> v1::ProbeCounters {
        let (name, c) = self;
        v1::ProbeCounters {
            probe: name.clone(),
            seen: c.seen,
            emitted: c.emitted,
            aggregated: c.aggregated,
            dropped_by_reason: c.drops().map(|(reason, n)| (reason.to_string(), n)).collect(),
        }
    }
}

/// A drop reason this build does not know has no slot: its drops are not counted (see the module
/// docs).
impl FromProto for (String, ProbeCounters) {
    fn from_proto(p: v1::ProbeCounters) -> Result<Self> {
        let mut c = ProbeCounters { seen: p.seen, emitted: p.emitted, aggregated: p.aggregated, ..Default::default() };
        for (reason, n) in p.dropped_by_reason {
            if let Some(i) = drop_reasons().iter().position(|r| *r == reason) {
                c.dropped_by_reason[i] = n;
            }
        }
        Ok((p.probe, c))
    }
}

wire_message! {
    PipelineStats => PipelineStats {
        received,
        decoded,
        decode_errors: Counts(DECODE_ERROR_REASONS),
        seeded_fds,
        scan_unreadable,
        scan_not_devices,
        processes_reconciled,
        lost_records_untracked,
        fd_map_cleanups,
        fd_map_errors,
        inflight_swept,
        cuda_libraries_found,
        cuda_library_errors,
        cuda_libraries_detached,
        cgroup_paths_by_id,
        cgroup_paths_by_walk,
        cgroup_paths_unresolved,
        cgroup_walks,
    }
}

wire_message! {
    Accounting => Accounting {
        seen,
        received,
        aggregated,
        dropped,
        in_flight,
        exact,
    }
}

/// NVML-only, or attached in one of the config's modes: one flat enum on the wire.
impl WireEnum for ProbeMode {
    fn to_wire(self) -> i32 {
        let mode = match self {
            ProbeMode::NvmlOnly => v1::AttachMode::NvmlOnly,
            ProbeMode::Attached(AttachMode::Auto) => v1::AttachMode::Auto,
            ProbeMode::Attached(AttachMode::DriverEntry) => v1::AttachMode::DriverEntry,
            ProbeMode::Attached(AttachMode::BtfTracepoint) => v1::AttachMode::BtfTracepoint,
            ProbeMode::Attached(AttachMode::RawTracepoint) => v1::AttachMode::RawTracepoint,
            ProbeMode::Attached(AttachMode::SyscallTracepoint) => v1::AttachMode::SyscallTracepoint,
        };
        mode.into()
    }

    fn from_wire(value: i32, field: &'static str) -> Result<Self> {
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
}
