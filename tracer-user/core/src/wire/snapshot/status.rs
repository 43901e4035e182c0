//! The agent's status as `AgentStatus`: the probe report of its start and the latest snapshot's
//! NVML, Kubernetes and counters. One way only: clients read the message as it is, so these types
//! implement [`ToProto`] alone.
use gpu_tracer_proto::v1;

use crate::model::{
    AgentSnapshot, ApiStats, OtlpStats,
    probes::{DeviceCheckReport, FamilyStatus, KernelFeatures, LibraryReport, ProbeReport},
};

use super::codec::{Codec as _, Msg, ToProto, WireEnum as _};

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
        attach_mode: report.attach_mode.to_wire(),
        attach_reason: report.attach_reason.clone(),
        driver_version: s.driver_version.clone(),
        driver_abi: report.driver_abi.clone(),
        driver: Some(report.driver.to_proto()),
        lifecycle: Some(report.lifecycle.to_proto()),
        cuda: Some(report.cuda.to_proto()),
        cuda_libraries: report.cuda_libraries.iter().map(ToProto::to_proto).collect(),
        nvml_status: s.nvml.status.to_wire(),
        nvml_reason: s.nvml.reason.clone(),
        kubernetes_status: s.kubernetes.status.to_wire(),
        kubernetes_detail: s.kubernetes.detail.clone(),
        accounting: Msg.write(&s.accounting),
        pipeline: Msg.write(&s.pipeline),
        snapshot_taken_at_unix_ns: taken_at_unix_ns,
        kernel: Some(report.features.to_proto()),
        api: s.api.as_ref().map(ToProto::to_proto),
        otlp: s.otlp.as_ref().map(ToProto::to_proto),
        device_check: Some(report.device_check.to_proto()),
    }
}

impl ToProto for FamilyStatus {
    type Proto = v1::ProbeFamily;

    fn to_proto(&self) -> v1::ProbeFamily {
        let (state, programs, error) = match self {
            FamilyStatus::Attached { programs } => (v1::FamilyState::Attached, programs.clone(), String::new()),
            FamilyStatus::Disabled => (v1::FamilyState::Disabled, Vec::new(), String::new()),
            FamilyStatus::Failed { error } => (v1::FamilyState::Failed, Vec::new(), error.clone()),
            FamilyStatus::NothingToProbe { error } => (v1::FamilyState::NothingToProbe, Vec::new(), error.clone()),
        };
        v1::ProbeFamily { state: state.into(), programs, error }
    }
}

impl ToProto for LibraryReport {
    type Proto = v1::CudaLibrary;

    fn to_proto(&self) -> v1::CudaLibrary {
        v1::CudaLibrary {
            path: self.path.clone(),
            inode: self.inode,
            method: self.method.as_str().into(),
            method_detail: self.method_detail.clone(),
            uprobes: self.uprobes as u32,
            links: self.links as u32,
            entries: self
                .entries
                .iter()
                .map(|e| v1::CudaEntryPoint {
                    symbol: e.symbol.into(),
                    status: e.status.into(),
                    detail: e.detail.clone(),
                })
                .collect(),
        }
    }
}

impl ToProto for KernelFeatures {
    type Proto = v1::KernelFeatures;

    fn to_proto(&self) -> v1::KernelFeatures {
        v1::KernelFeatures {
            release: self.release.clone(),
            btf: self.btf,
            tracefs: self.tracefs,
            kprobes: self.kprobes,
            nvidia_module: self.nvidia_module,
            syscall_tracepoints: self.syscall_tracepoints,
        }
    }
}

impl ToProto for DeviceCheckReport {
    type Proto = v1::DeviceCheck;

    fn to_proto(&self) -> v1::DeviceCheck {
        v1::DeviceCheck { enabled: self.enabled, simulated_files: self.simulated_files, detail: self.detail.clone() }
    }
}

impl ToProto for ApiStats {
    type Proto = v1::ApiHub;

    fn to_proto(&self) -> v1::ApiHub {
        v1::ApiHub {
            published: self.published,
            subscribers: self.subscribers,
            subscriptions: self.subscriptions,
            refused: self.refused,
            lost: self.lost,
        }
    }
}

impl ToProto for OtlpStats {
    type Proto = v1::OtlpExport;

    fn to_proto(&self) -> v1::OtlpExport {
        v1::OtlpExport {
            endpoint: self.endpoint.clone(),
            protocol: self.protocol.to_string(),
            metric_points_exported: self.metric_points_exported,
            log_records_exported: self.log_records_exported,
            log_queue_length: self.log_queue_len as u64,
            log_queue_capacity: self.log_queue_capacity as u64,
            dropped: self
                .dropped
                .iter()
                .map(|d| v1::OtlpDropped { signal: d.signal.into(), reason: d.reason.into(), count: d.count })
                .collect(),
            last_error: self.last_error.clone().unwrap_or_default(),
            log_retries: self.log_retries,
        }
    }
}
