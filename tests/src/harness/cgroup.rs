//! [`PodCgroup`]: a cgroup v2 directory named the way the kubelet (systemd driver) and a
//! container runtime name a pod's container, removed with its processes on drop.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{HarnessError, Result, random_bytes, signal};
use crate::fake_driver::mounts_of_type;

/// Environment variable naming a directory (relative to the cgroup2 mount) to create the test
/// `kubepods.slice` under, instead of the mount root. Useful on a real Kubernetes node, where the
/// kubelet owns the real `kubepods.slice` and would garbage-collect unknown pod cgroups in it.
pub const CGROUP_BASE_ENV: &str = "GPU_TRACER_TEST_CGROUP_BASE";

const KILL_TIMEOUT: Duration = Duration::from_secs(5);

/// Parent directories (`kubepods.slice`, QoS and pod slices) created by guards of this process,
/// with the number of live guards using each. Tests run in parallel threads and share parents;
/// the last guard using a parent removes it. The lock also keeps one guard from removing a parent
/// while another is creating below it.
static SHARED_PARENTS: Mutex<BTreeMap<PathBuf, usize>> = Mutex::new(BTreeMap::new());

/// The pod's QoS class, which decides the slice it lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Qos {
    Guaranteed,
    Burstable,
    BestEffort,
}

/// The container runtime, which decides the container scope's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runtime {
    /// `cri-containerd-<id>.scope`
    Containerd,
    /// `crio-<id>.scope`
    CriO,
    /// `docker-<id>.scope`
    Docker,
}

/// Create `dir` unless it exists; returns whether it was created. A guard in another process may
/// remove a shared parent between our steps, so creation is retried.
fn mkdir(dir: &Path) -> Result<bool> {
    for _ in 0..50 {
        match std::fs::create_dir(dir) {
            Ok(()) => return Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(false),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // The parent vanished under us: recreate it, then retry.
                if let Some(parent) = dir.parent() {
                    let _ = std::fs::create_dir(parent);
                }
            }
            Err(e) => return Err(HarnessError::io(format!("mkdir {}", dir.display()), e)),
        }
    }
    Err(HarnessError::Protocol(format!("could not create {}", dir.display())))
}

/// The cgroup v2 mount point, from `/proc/self/mountinfo` (the first `cgroup2` mount).
pub fn cgroup2_mount() -> Option<PathBuf> {
    mounts_of_type("cgroup2").into_iter().next()
}

/// A container cgroup such as
/// `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope`
/// (the pod UID with `-` replaced by `_`, as systemd requires). On drop its processes are killed
/// and every directory this guard created is removed, leaf first; shared parents another test is
/// still using stay.
#[derive(Debug)]
pub struct PodCgroup {
    path: PathBuf,
    relative: String,
    /// Parent directories this guard holds a reference to in [`SHARED_PARENTS`], outermost first.
    parents: Vec<PathBuf>,
    /// Whether the leaf was created (only then is it ours to empty and remove).
    own_leaf: bool,
    pod_uid: String,
    container_id: String,
    id: u64,
}

impl PodCgroup {
    /// A burstable pod's containerd container (the common case).
    pub fn new() -> Result<Self> {
        Self::create(Qos::Burstable, Runtime::Containerd)
    }

    /// A container cgroup for a pod of `qos` run by `runtime`, with a random pod UID and
    /// container id.
    pub fn create(qos: Qos, runtime: Runtime) -> Result<Self> {
        let mount =
            cgroup2_mount().ok_or_else(|| HarnessError::Protocol("no cgroup2 mount in /proc/self/mountinfo".into()))?;
        let pod_uid = std::fs::read_to_string("/proc/sys/kernel/random/uuid")
            .map_err(|e| HarnessError::io("read /proc/sys/kernel/random/uuid", e))?
            .trim()
            .to_string();
        let container_id: String = random_bytes(32)?.iter().map(|b| format!("{b:02x}")).collect();
        let uid_ = pod_uid.replace('-', "_");
        let mut parts: Vec<String> = Vec::new();
        if let Ok(base) = std::env::var(CGROUP_BASE_ENV) {
            parts.extend(base.split('/').filter(|p| !p.is_empty()).map(String::from));
        }
        parts.push("kubepods.slice".into());
        match qos {
            Qos::Guaranteed => parts.push(format!("kubepods-pod{uid_}.slice")),
            Qos::Burstable => {
                parts.push("kubepods-burstable.slice".into());
                parts.push(format!("kubepods-burstable-pod{uid_}.slice"));
            }
            Qos::BestEffort => {
                parts.push("kubepods-besteffort.slice".into());
                parts.push(format!("kubepods-besteffort-pod{uid_}.slice"));
            }
        }
        parts.push(match runtime {
            Runtime::Containerd => format!("cri-containerd-{container_id}.scope"),
            Runtime::CriO => format!("crio-{container_id}.scope"),
            Runtime::Docker => format!("docker-{container_id}.scope"),
        });
        // The leaf path is set before anything is created, so that a guard dropped half-way
        // never points at (and kills the processes of) a parent cgroup.
        let leaf = parts.iter().fold(mount.clone(), |p, part| p.join(part));
        let mut guard = PodCgroup {
            path: leaf,
            relative: format!("/{}", parts.join("/")),
            parents: Vec::new(),
            own_leaf: false,
            pod_uid,
            container_id,
            id: 0,
        };
        let mut registry = SHARED_PARENTS.lock().unwrap_or_else(|e| e.into_inner());
        let mut dir = mount;
        for (i, part) in parts.iter().enumerate() {
            dir.push(part);
            let created = mkdir(&dir)?;
            if i + 1 == parts.len() {
                if !created {
                    return Err(HarnessError::Protocol(format!("{} already exists", dir.display())));
                }
                guard.own_leaf = true;
            } else if created || registry.contains_key(&dir) {
                *registry.entry(dir.clone()).or_default() += 1;
                guard.parents.push(dir.clone());
            }
        }
        drop(registry);
        guard.id = std::fs::metadata(&guard.path)
            .map_err(|e| HarnessError::io(format!("stat {}", guard.path.display()), e))?
            .ino();
        Ok(guard)
    }

    /// Absolute path of the container cgroup.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Path relative to the cgroup2 mount, as `/proc/PID/cgroup` shows it (`0::<this>`) for a
    /// process whose cgroup namespace is the root one.
    pub fn relative_path(&self) -> &str {
        &self.relative
    }

    /// The cgroup id: the directory's inode number, which is what `bpf_get_current_cgroup_id()`
    /// returns for tasks in it.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The pod UID (with dashes).
    pub fn pod_uid(&self) -> &str {
        &self.pod_uid
    }

    /// The 64-hex-digit container id.
    pub fn container_id(&self) -> &str {
        &self.container_id
    }

    /// Move process `pid` into this cgroup.
    pub fn add_process(&self, pid: u32) -> Result<()> {
        let p = self.path.join("cgroup.procs");
        std::fs::write(&p, pid.to_string()).map_err(|e| HarnessError::io(format!("write {}", p.display()), e))
    }

    /// Pids currently in the cgroup.
    pub fn procs(&self) -> Result<Vec<u32>> {
        let p = self.path.join("cgroup.procs");
        let text = std::fs::read_to_string(&p).map_err(|e| HarnessError::io(format!("read {}", p.display()), e))?;
        Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
    }

    /// SIGKILL everything in the cgroup and wait until it is empty.
    pub fn kill_all(&self) -> Result<()> {
        let kill_file = self.path.join("cgroup.kill");
        let start = Instant::now();
        loop {
            let procs = self.procs()?;
            if procs.is_empty() {
                return Ok(());
            }
            if std::fs::write(&kill_file, "1").is_err() {
                // Kernels before 5.14 have no cgroup.kill.
                for pid in procs {
                    signal(pid, libc::SIGKILL);
                }
            }
            if start.elapsed() > KILL_TIMEOUT {
                return Err(HarnessError::Timeout {
                    what: format!("{} to empty", self.path.display()),
                    after: KILL_TIMEOUT,
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for PodCgroup {
    fn drop(&mut self) {
        if self.own_leaf {
            let _ = self.kill_all();
            // The leaf must go; retry while the killed tasks finish exiting.
            let start = Instant::now();
            while std::fs::remove_dir(&self.path).is_err() && self.path.exists() && start.elapsed() < KILL_TIMEOUT {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        // Parents created by this process go with their last user (rmdir also refuses while a
        // cgroup made elsewhere is still inside).
        let mut registry = SHARED_PARENTS.lock().unwrap_or_else(|e| e.into_inner());
        for dir in self.parents.iter().rev() {
            let Some(n) = registry.get_mut(dir) else { continue };
            *n -= 1;
            if *n == 0 {
                registry.remove(dir);
                let _ = std::fs::remove_dir(dir);
            }
        }
    }
}
