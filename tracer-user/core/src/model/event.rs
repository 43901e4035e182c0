//! What is known about an event beyond its kernel record.
use std::sync::Arc;

use crate::identity::ContainerIdentity;

/// What later stages know about an event that the kernel record does not carry: when it happened
/// on the wall clock, the process and cgroup it came from, and what the ledgers said of it. Every
/// event exporter (protobuf, JSON) reads this one type.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EventContext {
    /// Wall-clock time of the event, ns since the Unix epoch (from `ktime_ns` and the boot offset).
    pub wall_time_unix_ns: u64,
    /// Start time of the process, ns since boot; 0 if unknown.
    pub process_start_time_ns: u64,
    /// cgroup v2 path of `header.cgroup_id`, relative to the mount, if resolved.
    pub cgroup_path: Option<String>,
    /// Command name of the process, if known. Process exec/exit events carry their own.
    pub comm: Option<String>,
    /// Bytes an RM free, a vid-heap free, a cuMemFree or a process exit released, per the ledgers.
    pub released_bytes: Option<u64>,
    /// The kernel name of a launch's function, resolved from the handle lookups seen.
    pub kernel_name: Option<String>,
    /// Who the event's cgroup is (container, pod, allocated GPUs), when resolved.
    pub container: Option<Arc<ContainerIdentity>>,
}
