//! Pods as the attribution keys see them ([`PodIdentity`]), where they come from ([`PodLookup`]:
//! the agent's pod cache of this node's pods), and how the pod watcher stands ([`KubeStatus`]).
use std::collections::BTreeMap;

use super::cgroup::CgroupIdentity;

/// A pod (and, when the lookup named one, a container) as the attribution keys see it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodIdentity {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's UID.
    pub uid: String,
    /// The container, when the lookup was by container id (or a cgroup naming a known container).
    pub container_name: Option<String>,
    /// The workload kind: `Deployment` (from a ReplicaSet), `CronJob` (from a Job it names),
    /// else the controlling owner reference's kind (`StatefulSet`, `DaemonSet`, `Job`, `Node` for
    /// static pods…); `None` for a bare pod.
    pub owner_kind: Option<String>,
    /// The workload name that goes with `owner_kind`.
    pub owner_name: Option<String>,
    /// The pod labels named in `kubernetes.label_allow_list`, and only those.
    pub labels: BTreeMap<String, String>,
    /// Per container name, the GPUs it asks for: resource name (`nvidia.com/gpu`) → count, from
    /// limits (else requests) of the resources in `kubernetes.gpu_resource_names`. Containers
    /// asking for none are absent.
    pub gpu_requests: BTreeMap<String, BTreeMap<String, u64>>,
    /// The node the pod is bound to.
    pub node: Option<String>,
}

/// Who a cgroup's pod is. The agent's pod cache (this node's pods from the API server) answers it;
/// without Kubernetes there is none and containers are named from their cgroup path.
pub trait PodLookup {
    /// The pod (and container, when known) a parsed cgroup belongs to.
    fn by_cgroup(&self, cgroup: &CgroupIdentity) -> Option<PodIdentity>;
}

/// Where the pod watcher stands.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct KubeStatus {
    /// The node whose pods are watched.
    pub node: String,
    /// The API server URL.
    pub server: String,
    /// The last request to the API server (list, watch, or a reconnection probe) succeeded.
    pub connected: bool,
    /// The first complete list has arrived (lookups are meaningful).
    pub ready: bool,
    /// The last error the watcher met, with its causes; kept after recovery, for diagnosis.
    pub last_error: Option<String>,
    /// Errors met so far.
    pub errors: u64,
    /// Complete lists after the first one (after `410 Gone`, or a reconnection that lost history).
    pub relists: u64,
    /// Pods in the cache.
    pub pods_cached: usize,
    /// `resource.k8s.io` versions the server serves (empty: DRA not served); `None` until
    /// discovered.
    pub dra_versions: Option<Vec<String>>,
}
