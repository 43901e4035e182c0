//! Who a GPU user is: cgroup path → container id and pod UID ([`cgroup`], pure), pod UID /
//! container id → pod metadata ([`pod`]: what a pod lookup answers; the agent watches this node's
//! pods on the Kubernetes API in [`kube`]), and the whole identity of a cgroup ([`container`]).
pub mod cgroup;
pub mod container;
pub mod pod;

pub use cgroup::{
    CgroupDriver, CgroupIdentity, CgroupKind, CgroupLine, ContainerRuntime, ProcCgroup, QosClass, parse_cgroup_path,
    parse_proc_pid_cgroup,
};
pub use container::ContainerIdentity;
pub use pod::{KubeStatus, PodIdentity, PodLookup};
