//! Cgroup path → container id, pod UID and QoS class: pure parsing of the names the kubelet and the
//! container runtimes give cgroups.
//!
//! Layouts understood (cgroup v2 paths, or the path field of a cgroup v1 line):
//!
//! * systemd driver, containerd:
//!   `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice/cri-containerd-<id>.scope`
//!   (Guaranteed pods have no QoS slice: `/kubepods.slice/kubepods-pod<uid_>.slice/…`);
//! * systemd driver, CRI-O: `…-pod<uid_>.slice/crio-<id>.scope`, its monitor `crio-conmon-<id>.scope`;
//! * systemd driver, Docker (cri-dockerd): `…-pod<uid_>.slice/docker-<id>.scope`;
//! * cgroupfs driver: `/kubepods/burstable/pod<uid>/<id>`, CRI-O `…/pod<uid>/crio-<id>` and
//!   `…/crio-conmon-<id>`.
//!
//! The kubepods root may sit below a prefix: a kind node (`/kubelet.slice/kubelet-kubepods.slice/…`,
//! seen from the host as `/system.slice/docker-<node>.scope/kubelet.slice/…` or, on cgroup v1,
//! `/docker/<node>/kubepods/…`), or a kubelet `--cgroup-root`. Everything after the container's
//! own cgroup (crun's `container` sub-cgroup, for example) is ignored. With the cgroupfs driver the
//! container's directory is the bare id, which containerd and Docker both use: the runtime is then
//! [`ContainerRuntime::Unknown`].
//!
//! Outside Kubernetes, a plain Docker container (`/docker/<id>`, `/system.slice/docker-<id>.scope`)
//! is a [`CgroupKind::Container`] without a pod; systemd's own slices are [`CgroupKind::Host`].

/// The container runtime that named the cgroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ContainerRuntime {
    /// `cri-containerd-<id>.scope`.
    Containerd,
    /// `crio-<id>.scope`, `crio-<id>`, `crio-conmon-<id>…`.
    CriO,
    /// `docker-<id>.scope` (cri-dockerd, or plain Docker), `/docker/<id>`.
    Docker,
    /// Not named by the path (the cgroupfs driver's bare ids), or not a container.
    Unknown,
}

/// A pod's Kubernetes QoS class, which decides the slice its cgroups live in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QosClass {
    /// Requests equal limits for every resource: directly under `kubepods`.
    Guaranteed,
    /// Under `kubepods-burstable` / `kubepods/burstable`.
    Burstable,
    /// Under `kubepods-besteffort` / `kubepods/besteffort`.
    BestEffort,
}

/// How the kubelet names cgroups: systemd slices and scopes, or plain directories.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CgroupDriver {
    /// `*.slice` / `*.scope` names.
    Systemd,
    /// Plain directory names (`kubepods/burstable/pod<uid>/<id>`).
    Cgroupfs,
}

/// What the cgroup is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CgroupKind {
    /// A container's cgroup (also a pod's sandbox container: its name is the same shape, so the
    /// pod metadata, not the path, tells them apart).
    Container,
    /// CRI-O's per-container monitor process (`crio-conmon-<id>`), not the workload itself.
    ContainerMonitor,
    /// A pod's own cgroup (or a QoS / kubepods slice) rather than one of its containers.
    Pod,
    /// The host: the root cgroup, or systemd's `system.slice`, `user.slice`, `init.scope`.
    Host,
    /// Anything else (other managers, unknown layouts, malformed input).
    Other,
}

/// What a cgroup path says about who owns it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CgroupIdentity {
    /// The runtime that named the container cgroup.
    pub runtime: ContainerRuntime,
    /// The full 64-hex container id (lower case), when the path names a container.
    pub container_id: Option<String>,
    /// The pod UID, with the dashes systemd names replace by `_` restored.
    pub pod_uid: Option<String>,
    /// The pod's QoS class, when under `kubepods`.
    pub qos: Option<QosClass>,
    /// The naming scheme; `None` when the path shows neither (`/`, malformed input).
    pub cgroup_driver: Option<CgroupDriver>,
    /// What the cgroup is.
    pub kind: CgroupKind,
}

impl CgroupIdentity {
    fn other() -> Self {
        Self {
            runtime: ContainerRuntime::Unknown,
            container_id: None,
            pod_uid: None,
            qos: None,
            cgroup_driver: None,
            kind: CgroupKind::Other,
        }
    }
}

/// Parse a cgroup path (relative to the cgroup mount, starting with `/`). Never fails: paths that
/// say nothing recognisable are [`CgroupKind::Other`].
pub fn parse_cgroup_path(path: &str) -> CgroupIdentity {
    let path = path.trim();
    if !path.starts_with('/') || path.contains(['\0', '\n']) {
        return CgroupIdentity::other();
    }
    let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    if comps.is_empty() {
        return CgroupIdentity { kind: CgroupKind::Host, ..CgroupIdentity::other() };
    }
    if let Some(root) = comps.iter().position(|c| is_kubepods_root(c)) {
        return parse_kubepods(&comps[root..]);
    }
    parse_outside_kubernetes(&comps)
}

/// `kubepods` (cgroupfs), `kubepods.slice`, or a slice nested under another root whose last
/// dash-separated element is `kubepods` (kind's `kubelet-kubepods.slice`).
fn is_kubepods_root(c: &str) -> bool {
    c == "kubepods" || c.strip_suffix(".slice").is_some_and(|s| s.rsplit('-').next() == Some("kubepods"))
}

fn parse_kubepods(comps: &[&str]) -> CgroupIdentity {
    let driver = if comps[0].ends_with(".slice") { CgroupDriver::Systemd } else { CgroupDriver::Cgroupfs };
    let mut id = CgroupIdentity {
        runtime: ContainerRuntime::Unknown,
        container_id: None,
        pod_uid: None,
        qos: None,
        cgroup_driver: Some(driver),
        kind: CgroupKind::Pod,
    };
    let mut rest = &comps[1..];
    // QoS level: absent for Guaranteed pods, which sit directly under kubepods.
    if let Some(first) = rest.first() {
        let name = match driver {
            CgroupDriver::Systemd => first.strip_suffix(".slice").and_then(|s| s.rsplit('-').next()),
            CgroupDriver::Cgroupfs => Some(*first),
        };
        match name {
            Some("burstable") => {
                id.qos = Some(QosClass::Burstable);
                rest = &rest[1..];
            }
            Some("besteffort") => {
                id.qos = Some(QosClass::BestEffort);
                rest = &rest[1..];
            }
            _ => {}
        }
    }
    let Some(pod) = rest.first() else { return id };
    let uid = match driver {
        CgroupDriver::Systemd => pod.strip_suffix(".slice").and_then(|s| s.rsplit('-').next()),
        CgroupDriver::Cgroupfs => Some(*pod),
    }
    .and_then(|s| s.strip_prefix("pod"))
    .and_then(pod_uid);
    let Some(uid) = uid else {
        return CgroupIdentity { kind: CgroupKind::Other, ..id };
    };
    id.pod_uid = Some(uid);
    if id.qos.is_none() {
        id.qos = Some(QosClass::Guaranteed);
    }
    let Some(ctr) = rest.get(1) else { return id };
    match parse_container(ctr, driver) {
        Some((runtime, cid, kind)) => {
            id.runtime = runtime;
            id.container_id = Some(cid);
            id.kind = kind;
        }
        None => id.kind = CgroupKind::Other,
    }
    id
}

/// A container cgroup's name → (runtime, id, kind).
fn parse_container(name: &str, driver: CgroupDriver) -> Option<(ContainerRuntime, String, CgroupKind)> {
    let base = match driver {
        CgroupDriver::Systemd => name.strip_suffix(".scope")?,
        CgroupDriver::Cgroupfs => name,
    };
    let (runtime, kind, id) = if let Some(id) = base.strip_prefix("cri-containerd-") {
        (ContainerRuntime::Containerd, CgroupKind::Container, id)
    } else if let Some(id) = base.strip_prefix("crio-conmon-") {
        (ContainerRuntime::CriO, CgroupKind::ContainerMonitor, id)
    } else if let Some(id) = base.strip_prefix("crio-") {
        (ContainerRuntime::CriO, CgroupKind::Container, id)
    } else if let Some(id) = base.strip_prefix("docker-") {
        (ContainerRuntime::Docker, CgroupKind::Container, id)
    } else if driver == CgroupDriver::Cgroupfs {
        (ContainerRuntime::Unknown, CgroupKind::Container, base)
    } else {
        return None;
    };
    container_id(id).map(|id| (runtime, id, kind))
}

fn parse_outside_kubernetes(comps: &[&str]) -> CgroupIdentity {
    let systemd = comps.iter().any(|c| c.ends_with(".slice") || c.ends_with(".scope") || c.ends_with(".service"));
    let driver = Some(if systemd { CgroupDriver::Systemd } else { CgroupDriver::Cgroupfs });
    // Plain Docker: `/docker/<id>` (cgroupfs) or `/system.slice/docker-<id>.scope` (systemd).
    let docker_id = match comps {
        ["docker", id, ..] => container_id(id),
        ["system.slice", scope, ..] => {
            scope.strip_prefix("docker-").and_then(|s| s.strip_suffix(".scope")).and_then(container_id)
        }
        _ => None,
    };
    if let Some(cid) = docker_id {
        return CgroupIdentity {
            runtime: ContainerRuntime::Docker,
            container_id: Some(cid),
            cgroup_driver: driver,
            kind: CgroupKind::Container,
            ..CgroupIdentity::other()
        };
    }
    let host = matches!(comps[0], "system.slice" | "user.slice" | "init.scope");
    CgroupIdentity {
        cgroup_driver: driver,
        kind: if host { CgroupKind::Host } else { CgroupKind::Other },
        ..CgroupIdentity::other()
    }
}

/// A full container id: exactly 64 hex digits (returned lower case).
fn container_id(s: &str) -> Option<String> {
    (s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())).then(|| s.to_ascii_lowercase())
}

/// A pod UID as it appears in a cgroup name: a UUID (dashes or systemd's underscores), or the 32-hex
/// config hash the kubelet uses as the UID of static pods.
fn pod_uid(s: &str) -> Option<String> {
    let uid = s.replace('_', "-").to_ascii_lowercase();
    let hex = |s: &str| s.bytes().all(|b| b.is_ascii_hexdigit());
    let parts: Vec<&str> = uid.split('-').collect();
    let uuid = parts.iter().map(|p| p.len()).eq([8, 4, 4, 4, 12]) && parts.iter().all(|p| hex(p));
    let hash = uid.len() == 32 && hex(&uid);
    (uuid || hash).then_some(uid)
}

/// Which `/proc/PID/cgroup` line a [`ProcCgroup`] came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CgroupLine {
    /// The cgroup v2 (unified) line, `0::<path>`.
    V2,
    /// A cgroup v1 line, with its controllers (`memory`, `cpu,cpuacct`, `name=systemd`).
    V1 {
        /// The comma-separated controller list of the line.
        controllers: String,
    },
}

/// The cgroup a process is in, from its `/proc/PID/cgroup`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcCgroup {
    /// The path field of the chosen line.
    pub path: String,
    /// Which line it came from.
    pub line: CgroupLine,
    /// What the path says.
    pub identity: CgroupIdentity,
}

/// Parse `/proc/PID/cgroup`. Prefers the v2 `0::` line; on cgroup v1 and hybrid hosts (where the
/// `0::` line is only systemd's view), a v1 controller line that names a container or pod wins over
/// a `0::` line that does not. `None` when no line is well formed.
pub fn parse_proc_pid_cgroup(text: &str) -> Option<ProcCgroup> {
    let mut v2 = None;
    let mut v1 = Vec::new();
    for line in text.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(hier), Some(controllers), Some(path)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        if hier.parse::<u32>().is_err() || !path.starts_with('/') {
            continue;
        }
        let identity = parse_cgroup_path(path);
        if hier == "0" && controllers.is_empty() {
            v2 = Some(ProcCgroup { path: path.to_string(), line: CgroupLine::V2, identity });
        } else {
            let line = CgroupLine::V1 { controllers: controllers.to_string() };
            v1.push(ProcCgroup { path: path.to_string(), line, identity });
        }
    }
    let kube = |p: &ProcCgroup| p.identity.pod_uid.is_some() || p.identity.container_id.is_some();
    if let Some(v2) = v2.as_ref().filter(|p| kube(p)) {
        return Some(v2.clone());
    }
    // Prefer a line naming a container, then the memory controller's (what the kubelet accounts by).
    let memory = |p: &ProcCgroup| match &p.line {
        CgroupLine::V1 { controllers } => controllers.split(',').any(|c| c == "memory"),
        CgroupLine::V2 => false,
    };
    let best_v1 = v1
        .iter()
        .position(|p| p.identity.container_id.is_some())
        .or_else(|| v1.iter().position(kube))
        .map(|i| v1.swap_remove(i));
    best_v1.or(v2).or_else(|| {
        let i = v1.iter().position(memory).unwrap_or(0);
        (!v1.is_empty()).then(|| v1.swap_remove(i))
    })
}

/// A short name for a cgroup path: Kubernetes pod/container scopes become `pod <uid> / <ctr id>`,
/// anything else its last components.
pub fn short_name(path: Option<&str>, id: u64) -> String {
    let Some(p) = path else { return format!("cgroup #{id} (gone)") };
    if p == "/" {
        return "/ (host, no container)".into();
    }
    let comps: Vec<&str> = p.split('/').filter(|c| !c.is_empty()).collect();
    let pod = comps.iter().find_map(|c| {
        let c = c.strip_suffix(".slice").unwrap_or(c);
        c.rfind("-pod").map(|i| c[i + 4..].replace('_', "-")).or_else(|| c.strip_prefix("pod").map(str::to_string))
    });
    let ctr = comps.last().map(|c| {
        let c = c.strip_suffix(".scope").unwrap_or(c);
        let id = c.rsplit(['-', ':']).next().unwrap_or(c);
        id.to_string()
    });
    match (pod, ctr) {
        (Some(pod), Some(ctr)) if ctr.len() >= 8 => {
            format!("pod {}/{}", &pod[..pod.len().min(8)], &ctr[..8])
        }
        _ => {
            let tail = comps.iter().rev().take(2).rev().cloned().collect::<Vec<_>>().join("/");
            if tail.len() > 40 { format!("…{}", &tail[tail.len() - 39..]) } else { tail }
        }
    }
}

#[cfg(test)]
mod tests;
