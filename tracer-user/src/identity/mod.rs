//! Who a GPU user is: cgroup path → container id and pod UID ([`cgroup`], pure), and pod UID /
//! container id → pod metadata from this node's pods on the Kubernetes API ([`kube`]).
pub mod cgroup;
pub mod container;
pub mod kube;

pub use cgroup::{
    CgroupDriver, CgroupIdentity, CgroupKind, CgroupLine, ContainerRuntime, ProcCgroup, QosClass, parse_cgroup_path,
    parse_proc_pid_cgroup,
};
pub use container::ContainerIdentity;
pub use kube::{KubeError, KubeStart, KubeStatus, PodCache, PodIdentity, PodWatcher};
