//! What the agent knows about Kubernetes: the pod watcher, the kubelet's allocations, and which
//! GPUs each container used against what it was given.
use serde::Serialize;

use crate::{allocation::AllocationStatus, identity::KubeStatus};

/// Where Kubernetes identity stands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KubernetesStatus {
    /// Kubernetes was not started yet (`top`/`agent` start it once the probes are up).
    #[default]
    NotStarted,
    /// The pod watcher runs.
    Running,
    /// Not a Kubernetes node (no in-cluster environment or kubeconfig), in `auto` mode.
    NotInUse,
    /// A Kubernetes node whose API could not be used, in `auto` mode (the detail says why).
    Unavailable,
    /// `kubernetes.mode = "off"`.
    Off,
}

impl KubernetesStatus {
    /// The name shown by people-facing output (same as the JSON form).
    pub fn as_str(self) -> &'static str {
        match self {
            KubernetesStatus::NotStarted => "not-started",
            KubernetesStatus::Running => "running",
            KubernetesStatus::NotInUse => "not-in-use",
            KubernetesStatus::Unavailable => "unavailable",
            KubernetesStatus::Off => "off",
        }
    }
}

impl std::fmt::Display for KubernetesStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where Kubernetes identity stands, with the watcher's and the pod-resources poller's states.
#[derive(Clone, Debug, Default, Serialize)]
pub struct KubeView {
    pub status: KubernetesStatus,
    /// A line for people (what is used, or why not).
    pub detail: String,
    /// The pod watcher's state, when it runs.
    pub watcher: Option<KubeStatus>,
    /// The kubelet pod-resources poller's state, when it runs.
    pub pod_resources: Option<AllocationStatus>,
}

/// A container's GPU allocation beside its use: what the kubelet gave it and which GPUs it used
/// this interval; `outside_allocation` lists GPUs it used without holding them.
#[derive(Clone, Debug, Default, Serialize)]
pub struct AllocationUse {
    pub cgroup_id: u64,
    pub name: String,
    /// Raw kubelet device ids.
    pub allocated: Vec<String>,
    /// Physical GPU (or MIG device) UUIDs it was allocated, resolved through NVML.
    pub allocated_gpus: Vec<String>,
    /// GPU UUIDs it used (memory, processes or an open device node).
    pub used_gpus: Vec<String>,
    pub outside_allocation: Vec<String>,
}
