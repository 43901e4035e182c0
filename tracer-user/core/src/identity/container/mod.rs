//! One container's whole identity, as the exporters show it: the cgroup, what its path says
//! (runtime, container id, pod UID, QoS), the pod from the API server (namespace, name, container,
//! owner, allowed labels, GPU requests) and the GPUs the kubelet allocated to it. Each part is
//! optional: on a plain host only the cgroup is known, and that is still an identity.
use std::collections::BTreeMap;

use serde::Serialize;

use super::{CgroupIdentity, CgroupKind, PodLookup, parse_cgroup_path};
use crate::{
    allocation::{ContainerRef, GpuAllocations, GpuDevice},
    attribution::GpuRequest,
};

/// Who a cgroup is.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ContainerIdentity {
    pub cgroup_id: u64,
    /// Relative to the cgroup2 mount; `None` when the cgroup is gone or unknown.
    pub cgroup_path: Option<String>,
    /// `container` for a container's cgroup, `pod`, `host`, `other` (what the path says).
    pub kind: &'static str,
    /// `containerd`, `cri-o`, `docker`, or `None`.
    pub runtime: Option<&'static str>,
    pub container_id: Option<String>,
    pub pod_uid: Option<String>,
    /// `guaranteed`, `burstable`, `best-effort`.
    pub qos: Option<&'static str>,
    /// From the API server (when Kubernetes is in use and the pod is known).
    pub namespace: Option<String>,
    pub pod: Option<String>,
    pub container: Option<String>,
    pub owner_kind: Option<String>,
    pub owner_name: Option<String>,
    /// Only the labels in `kubernetes.label_allow_list`.
    pub labels: BTreeMap<String, String>,
    /// This container's GPU requests (resource name → count) from the pod spec.
    pub gpu_requests: BTreeMap<String, u64>,
    /// Device ids the kubelet allocated to it (pod-resources; raw, e.g. `GPU-…::2`, `MIG-…`).
    pub allocated_gpus: Vec<String>,
    /// Whether the kubelet's allocations were known when this was resolved (without them, an empty
    /// `allocated_gpus` means "unknown", not "none").
    pub allocations_known: bool,
}

impl ContainerIdentity {
    /// Resolve cgroup `cgroup_id` at `path` with what is available.
    pub fn resolve(
        cgroup_id: u64,
        path: Option<&str>,
        pods: Option<&dyn PodLookup>,
        allocations: Option<&GpuAllocations>,
    ) -> ContainerIdentity {
        let parsed = path.map(parse_cgroup_path);
        let mut id = ContainerIdentity {
            cgroup_id,
            cgroup_path: path.map(str::to_string),
            kind: parsed.as_ref().map_or("unknown", |p| kind_str(p.kind)),
            allocations_known: allocations.is_some(),
            ..Default::default()
        };
        if let Some(p) = &parsed {
            id.runtime = runtime_str(p);
            id.container_id = p.container_id.clone();
            id.pod_uid = p.pod_uid.clone();
            id.qos = p.qos.map(|q| match q {
                super::QosClass::Guaranteed => "guaranteed",
                super::QosClass::Burstable => "burstable",
                super::QosClass::BestEffort => "best-effort",
            });
            if let Some(pod) = pods.and_then(|c| c.by_cgroup(p)) {
                if let Some(c) = &pod.container_name {
                    id.gpu_requests = pod.gpu_requests.get(c).cloned().unwrap_or_default();
                }
                id.namespace = Some(pod.namespace);
                id.pod = Some(pod.name);
                id.container = pod.container_name;
                id.owner_kind = pod.owner_kind;
                id.owner_name = pod.owner_name;
                id.labels = pod.labels;
            }
        }
        if let (Some(a), Some(c)) = (allocations, id.container_ref()) {
            id.allocated_gpus = a.for_container(&c).iter().map(|g| g.raw_id.clone()).collect();
        }
        id
    }

    /// Is this a container (or a pod's own cgroup), as opposed to a host process's cgroup?
    pub fn is_container(&self) -> bool {
        matches!(self.kind, "container" | "pod") || self.pod.is_some()
    }

    /// `namespace/pod/container` when known.
    pub fn container_ref(&self) -> Option<ContainerRef> {
        Some(ContainerRef::new(self.namespace.clone()?, self.pod.clone()?, self.container.clone()?))
    }

    /// A name for people: `namespace/pod/container`, else `pod <uid8>/<ctr8>` from the cgroup
    /// path, else the path's last components.
    pub fn display_name(&self) -> String {
        match (&self.namespace, &self.pod, &self.container) {
            (Some(ns), Some(p), Some(c)) => return format!("{ns}/{p}/{c}"),
            (Some(ns), Some(p), None) => return format!("{ns}/{p}"),
            _ => {}
        }
        super::cgroup::short_name(self.cgroup_path.as_deref(), self.cgroup_id)
    }

    /// What this container asked for, as the attribution engine's rightsizing reads it: a MIG
    /// profile, a share of a GPU (time-slicing replicas, from the node's allocatable replicas),
    /// or whole GPUs.
    pub fn gpu_request(&self, allocations: Option<&GpuAllocations>) -> Option<GpuRequest> {
        if let Some((res, n)) = self.gpu_requests.iter().find(|(r, _)| r.starts_with("nvidia.com/mig-")) {
            return Some(GpuRequest::MigProfile {
                profile: res.trim_start_matches("nvidia.com/mig-").to_string(),
                count: *n as u32,
            });
        }
        if let (Some(a), Some(c)) = (allocations, self.container_ref()) {
            let held = a.for_container(&c);
            if !held.is_empty() && held.iter().all(|g| g.replica.is_some()) {
                let fractions: f64 = held.iter().map(|g| 1.0 / replicas_of(a, g).max(1) as f64).sum();
                return Some(GpuRequest::Fraction { fraction: fractions.min(1.0) });
            }
            if !held.is_empty() {
                return Some(GpuRequest::WholeGpus { count: held.len() as u32 });
            }
        }
        let n: u64 = self.gpu_requests.values().sum();
        (n > 0).then_some(GpuRequest::WholeGpus { count: n as u32 })
    }

    /// The share of physical GPU `uuid` (or MIG device) this container holds per the kubelet:
    /// 1 for a whole GPU or a MIG device, 1/N per time-slicing replica. `None` when it holds none.
    pub fn requested_fraction_of(&self, uuid: &str, allocations: Option<&GpuAllocations>) -> Option<f64> {
        let a = allocations?;
        let c = self.container_ref()?;
        let mut f = 0.0;
        for g in a.for_container(&c) {
            let on = match &g.device {
                GpuDevice::Gpu { uuid: u } | GpuDevice::Mig { uuid: u } => u == uuid,
                GpuDevice::MigLegacy { parent_uuid, .. } => parent_uuid == uuid,
                _ => false,
            };
            if on {
                f += match g.replica {
                    Some(_) => 1.0 / replicas_of(a, g).max(1) as f64,
                    None => 1.0,
                };
            }
        }
        (f > 0.0).then_some(f.min(1.0))
    }
}

/// How many time-slicing replicas the node offers of `g`'s GPU (from the allocatable list).
fn replicas_of(a: &GpuAllocations, g: &crate::allocation::AllocatedGpu) -> usize {
    a.allocatable.iter().filter(|x| x.device == g.device && x.replica.is_some()).count()
}

fn kind_str(k: CgroupKind) -> &'static str {
    match k {
        CgroupKind::Container => "container",
        CgroupKind::ContainerMonitor => "container-monitor",
        CgroupKind::Pod => "pod",
        CgroupKind::Host => "host",
        CgroupKind::Other => "other",
    }
}

fn runtime_str(p: &CgroupIdentity) -> Option<&'static str> {
    match p.runtime {
        super::ContainerRuntime::Containerd => Some("containerd"),
        super::ContainerRuntime::CriO => Some("cri-o"),
        super::ContainerRuntime::Docker => Some("docker"),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
