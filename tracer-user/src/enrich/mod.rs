//! The enrich stage: who a record's process and cgroup are, beyond the ids the kernel gives.
//! cgroup id → cgroup path (by walking the cgroup v2 mount), and process start time and command
//! name from `/proc` (the start time makes a reused PID a different process). [`Enricher`] holds
//! both caches for the pipeline; container and pod identity come after it (`identity`).
use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// Resolves cgroup v2 ids (directory inode numbers) to paths relative to the cgroup2 mount.
pub struct CgroupResolver {
    root: Option<PathBuf>,
    by_id: HashMap<u64, String>,
    last_walk: Option<Instant>,
    /// Walks done so far (each is a full directory walk).
    pub walks: u64,
}

impl CgroupResolver {
    pub fn new(root: Option<PathBuf>) -> Self {
        Self { root, by_id: HashMap::new(), last_walk: None, walks: 0 }
    }

    /// The cgroup2 mount in use.
    pub fn root(&self) -> Option<&Path> {
        self.root.as_deref()
    }

    /// Path of cgroup `id` (`/` for the root), walking the hierarchy again on a miss at most every
    /// 200 ms. `None` when unknown (removed, or no cgroup2 mount).
    pub fn resolve(&mut self, id: u64) -> Option<String> {
        if let Some(p) = self.by_id.get(&id) {
            return Some(p.clone());
        }
        let stale = self.last_walk.is_none_or(|t| t.elapsed() > Duration::from_millis(200));
        if stale {
            self.walk();
        }
        self.by_id.get(&id).cloned()
    }

    /// Remember a path learned elsewhere (e.g. from a cgroup-removal record).
    pub fn remember(&mut self, id: u64, path: String) {
        self.by_id.insert(id, path);
    }

    /// Forget a removed cgroup.
    pub fn forget(&mut self, id: u64) {
        self.by_id.remove(&id);
    }

    fn walk(&mut self) {
        self.last_walk = Some(Instant::now());
        self.walks += 1;
        let Some(root) = self.root.clone() else { return };
        let mut stack = vec![(root.clone(), String::from("/"))];
        let mut budget = 200_000usize; // bound the walk on huge hierarchies
        while let Some((dir, rel)) = stack.pop() {
            if let Ok(md) = std::fs::metadata(&dir) {
                self.by_id.insert(md.ino(), rel.clone());
            }
            let Ok(rd) = std::fs::read_dir(&dir) else { continue };
            for e in rd.flatten() {
                if budget == 0 {
                    return;
                }
                budget -= 1;
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let child = if rel == "/" { format!("/{name}") } else { format!("{rel}/{name}") };
                    stack.push((e.path(), child));
                }
            }
        }
    }
}

/// The enrich stage's state: process facts cached per tgid (until the process exits) and the
/// cgroup id → path resolver.
pub struct Enricher {
    proc_root: PathBuf,
    processes: HashMap<u32, ProcessInfo>,
    /// cgroup ids → paths under the cgroup2 mount.
    pub cgroups: CgroupResolver,
}

impl Enricher {
    /// An enricher reading `proc_root`, with cgroups under `cgroup_root` (default: the cgroup2
    /// mount `proc_root/self/mountinfo` names).
    pub fn new(proc_root: PathBuf, cgroup_root: Option<PathBuf>) -> Enricher {
        let root = cgroup_root.or_else(|| crate::source::procscan::cgroup2_mount(&proc_root.join("self/mountinfo")));
        Enricher { proc_root, processes: HashMap::new(), cgroups: CgroupResolver::new(root) }
    }

    /// Start time and comm of `tgid`, read from `/proc` once and cached; `None` if it is gone.
    pub fn process(&mut self, tgid: u32) -> Option<ProcessInfo> {
        if let Some(i) = self.processes.get(&tgid) {
            return Some(i.clone());
        }
        let i = process_info(&self.proc_root, tgid)?;
        self.processes.insert(tgid, i.clone());
        Some(i)
    }

    /// Start time and comm of `pid` read now, not cached (for processes no record named).
    pub fn process_now(&self, pid: u32) -> Option<ProcessInfo> {
        process_info(&self.proc_root, pid)
    }

    /// `tgid` exited: forget its cached facts (the PID may be reused).
    pub fn process_exited(&mut self, tgid: u32) {
        self.processes.remove(&tgid);
    }

    /// Is `pid` a process (its own thread group leader), not a thread?
    pub fn is_process(&self, pid: u32) -> bool {
        tgid_of(&self.proc_root, pid) == Some(pid)
    }

    /// The cgroup id of `tgid`, from `/proc/PID/cgroup` (for processes found by a scan).
    pub fn cgroup_id_of(&self, tgid: u32) -> Option<u64> {
        let rel = crate::source::procscan::process_cgroup_path(&self.proc_root, tgid)?;
        let root = self.cgroups.root()?;
        std::fs::metadata(root.join(rel.trim_start_matches('/'))).ok().map(|m| m.ino())
    }

    /// A cgroup id from a numeric id or a path relative to the cgroup2 mount.
    pub fn cgroup_id(&self, path_or_id: &str) -> Option<u64> {
        if let Ok(id) = path_or_id.parse::<u64>() {
            return Some(id);
        }
        let root = self.cgroups.root()?;
        std::fs::metadata(root.join(path_or_id.trim_start_matches('/'))).ok().map(|m| m.ino())
    }
}

/// What `/proc/PID/stat` tells about a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessInfo {
    /// Start time in clock ticks since boot (field 22).
    pub start_time_ticks: u64,
    pub comm: String,
}

/// Read start time and comm of `pid`; `None` if it is gone.
pub fn process_info(proc_root: &Path, pid: u32) -> Option<ProcessInfo> {
    let text = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
    parse_stat(&text)
}

/// Parse `/proc/PID/stat` (the comm may contain spaces and parentheses).
pub fn parse_stat(text: &str) -> Option<ProcessInfo> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_string();
    let rest: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    // rest[0] is field 3 (state); start time is field 22.
    let start_time_ticks = rest.get(22 - 3)?.parse().ok()?;
    Some(ProcessInfo { start_time_ticks, comm })
}

/// The Tgid of a task (`/proc/PID/status`), to tell a forked process from a new thread.
pub fn tgid_of(proc_root: &Path, pid: u32) -> Option<u32> {
    let text = std::fs::read_to_string(proc_root.join(pid.to_string()).join("status")).ok()?;
    text.lines().find_map(|l| l.strip_prefix("Tgid:").and_then(|v| v.trim().parse().ok()))
}

#[cfg(test)]
mod tests;
