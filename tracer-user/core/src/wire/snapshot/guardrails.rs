//! Guardrails: the violations raised so far, and their counts.
use std::path::PathBuf;

use gpu_tracer_proto::v1;

use crate::guardrails::{Evidence, GpuRef, Violation, ViolationCounts, ViolationKind, VisibleDevices};

use super::{
    Result, SnapshotError,
    codec::{FromProto, ToProto, non_empty, required, wire_message},
};

// By hand: the message flattens the GPU and the evidence, and names the kind by its string.
impl ToProto for Violation {
    type Proto = v1::RaisedViolation;

    fn to_proto(&self) -> v1::RaisedViolation {
        let g = self.gpu.clone().unwrap_or_default();
        let e = &self.evidence;
        let violation = v1::Violation {
            kind: self.kind.as_str().into(),
            namespace: self.namespace.clone(),
            pod: self.pod.clone(),
            container: self.container.clone(),
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
        v1::RaisedViolation { violation: Some(violation), pid: self.pid }
    }
}

impl FromProto for Violation {
    fn from_proto(r: v1::RaisedViolation) -> Result<Self> {
        let v = required(r.violation, "RaisedViolation.violation")?;
        let kind = ViolationKind::ALL
            .into_iter()
            .find(|k| k.as_str() == v.kind)
            .ok_or_else(|| SnapshotError::UnknownName { field: "Violation.kind", value: v.kind.clone() })?;
        let gpu = GpuRef {
            uuid: non_empty(v.gpu_uuid),
            minor: v.gpu_minor,
            index: v.gpu_index,
            mig_uuid: non_empty(v.mig_uuid),
        };
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
}

wire_message! {
    ViolationCounts => ViolationCounts {
        unallocated_gpu_open,
        unallocated_gpu_in_nvml,
        gpu_use_without_allocation,
        visible_devices_all_without_request,
        unresolved,
    }
}
