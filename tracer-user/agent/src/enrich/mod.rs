//! The enrich stage: who a record's process and cgroup are, beyond the ids the kernel gives.
//! cgroup id → cgroup path (by id through the kernel, else by walking the cgroup v2 mount), and
//! process start time and command name from `/proc` (the start time makes a reused PID a different
//! process). [`Enricher`] holds both caches for the pipeline; container and pod identity come after
//! it (`identity`).
use std::{
    collections::{HashMap, HashSet},
    os::{
        fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd},
        unix::fs::MetadataExt,
    },
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// How cgroup ids became paths, counted (`PipelineStats`, `gpu_tracer_cgroup_path_lookups_total`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupLookups {
    /// Ids not known before whose path the kernel gave by id (`open_by_handle_at`).
    pub by_id: u64,
    /// Ids not known before that a walk of the hierarchy found (when lookups by id are refused).
    pub by_walk: u64,
    /// Lookups that found no path: the cgroup is gone (or outside the mount), or, without lookups
    /// by id, the walk was not due yet.
    pub unresolved: u64,
    /// Full walks of the hierarchy (misses where lookups by id are refused).
    pub walks: u64,
}

/// Resolves cgroup v2 ids (directory inode numbers) to paths relative to the cgroup2 mount.
///
/// A cgroup seen for the first time is looked up by its id at once: cgroup v2 ids are kernfs node
/// ids, which `open_by_handle_at` takes as a `FILEID_KERNFS` file handle (needs
/// `CAP_DAC_READ_SEARCH`). Where the kernel refuses that, a miss walks the whole hierarchy again, at
/// most every 200 ms.
pub struct CgroupResolver {
    root: Option<PathBuf>,
    by_id: HashMap<u64, String>,
    /// Ids the kernel says do not exist (removed; ids are never reused), so a late event of a
    /// removed cgroup costs no system call. Bounded: cleared when full.
    gone: HashSet<u64>,
    handles: ByHandle,
    last_walk: Option<Instant>,
    /// What the lookups found so far.
    pub lookups: CgroupLookups,
}

/// Whether cgroup paths can be had by id.
enum ByHandle {
    /// Not tried yet: the mount is opened at the first miss.
    Untried,
    /// The cgroup2 mount, open, and its path as the kernel prints it (the prefix of every answer).
    Ready { mount: OwnedFd, prefix: String },
    /// Refused (no `CAP_DAC_READ_SEARCH`, no cgroup2 mount, a kernel without kernfs file handles).
    Unavailable,
}

/// Most removed ids remembered (16 bytes each at most in the set).
const MAX_GONE: usize = 4096;

impl CgroupResolver {
    pub fn new(root: Option<PathBuf>) -> Self {
        Self {
            root,
            by_id: HashMap::new(),
            gone: HashSet::new(),
            handles: ByHandle::Untried,
            last_walk: None,
            lookups: CgroupLookups::default(),
        }
    }

    /// The cgroup2 mount in use.
    pub fn root(&self) -> Option<&Path> {
        self.root.as_deref()
    }

    /// Path of cgroup `id` (`/` for the root). An id not known yet is looked up by id at once, or,
    /// where the kernel refuses that, by walking the hierarchy again (at most every 200 ms). `None`
    /// when unknown (removed, or no cgroup2 mount).
    pub fn resolve(&mut self, id: u64) -> Option<String> {
        if let Some(p) = self.by_id.get(&id) {
            return Some(p.clone());
        }
        if id == 0 || self.gone.contains(&id) {
            return None;
        }
        match self.lookup_by_id(id) {
            ByIdLookup::Found(path) => {
                self.lookups.by_id += 1;
                self.by_id.insert(id, path.clone());
                return Some(path);
            }
            ByIdLookup::Gone => {
                self.lookups.unresolved += 1;
                if self.gone.len() >= MAX_GONE {
                    self.gone.clear();
                }
                self.gone.insert(id);
                return None;
            }
            ByIdLookup::Unavailable => {}
        }
        if self.last_walk.is_none_or(|t| t.elapsed() > Duration::from_millis(200)) {
            self.walk();
        }
        let found = self.by_id.get(&id).cloned();
        match found {
            Some(_) => self.lookups.by_walk += 1,
            None => self.lookups.unresolved += 1,
        }
        found
    }

    /// Remember a path learned elsewhere (e.g. from a cgroup-removal record).
    pub fn remember(&mut self, id: u64, path: String) {
        self.by_id.insert(id, path);
    }

    /// Forget a removed cgroup.
    pub fn forget(&mut self, id: u64) {
        self.by_id.remove(&id);
    }

    /// Look `id` up through the kernel, opening the mount the first time.
    fn lookup_by_id(&mut self, id: u64) -> ByIdLookup {
        if matches!(self.handles, ByHandle::Untried) {
            self.handles = match self.root.as_deref().map(open_cgroup2_mount) {
                Some(Ok((mount, prefix))) => ByHandle::Ready { mount, prefix },
                Some(Err(e)) => {
                    tracing::info!(
                        "cgroup paths by id unavailable ({e}): a new cgroup is found by walking the hierarchy"
                    );
                    ByHandle::Unavailable
                }
                None => ByHandle::Unavailable,
            };
        }
        let ByHandle::Ready { mount, prefix } = &self.handles else { return ByIdLookup::Unavailable };
        match cgroup_path_by_id(mount.as_fd(), prefix, id) {
            Ok(Some(path)) => ByIdLookup::Found(path),
            Ok(None) => ByIdLookup::Gone,
            Err(e) => {
                tracing::info!(
                    "cgroup path by id refused ({e}; CAP_DAC_READ_SEARCH is needed): a new cgroup is found by \
                     walking the hierarchy"
                );
                self.handles = ByHandle::Unavailable;
                ByIdLookup::Unavailable
            }
        }
    }

    fn walk(&mut self) {
        self.last_walk = Some(Instant::now());
        self.lookups.walks += 1;
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

/// What a lookup by id gave.
enum ByIdLookup {
    Found(String),
    /// No such cgroup (removed), or not under the mount.
    Gone,
    /// The kernel refuses lookups by id.
    Unavailable,
}

/// `CGROUP2_SUPER_MAGIC` (include/uapi/linux/magic.h).
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
/// `FILEID_KERNFS` (include/linux/exportfs.h): the handle is the kernfs node's 64-bit id.
const FILEID_KERNFS: libc::c_int = 0xfe;

/// `struct file_handle` with the 8 bytes of a kernfs handle in its flexible array.
#[repr(C)]
struct KernfsFileHandle {
    handle_bytes: libc::c_uint,
    handle_type: libc::c_int,
    id: u64,
}

/// Opens the cgroup2 mount at `root` for [`cgroup_path_by_id`], with its path as the kernel
/// prints it (`readlink /proc/self/fd/N`, so a symlink in `root` does not matter).
pub fn open_cgroup2_mount(root: &Path) -> std::io::Result<(OwnedFd, String)> {
    let dir = std::fs::File::open(root)?;
    // SAFETY: statfs is plain C data (integers); all-zero is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: the fd is open for the call and `st` is a valid, writable statfs.
    if unsafe { libc::fstatfs(dir.as_raw_fd(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if st.f_type as i64 != CGROUP2_SUPER_MAGIC {
        let msg = format!("{} is not a cgroup2 mount", root.display());
        return Err(std::io::Error::new(std::io::ErrorKind::Unsupported, msg));
    }
    let prefix = fd_path(dir.as_raw_fd())?;
    Ok((dir.into(), prefix))
}

/// The path of cgroup `id` relative to the mount `mount` (whose own path is `prefix`): `Ok(None)`
/// when there is no such cgroup or it is not under the mount; `Err` when the kernel refuses the
/// lookup (EPERM without `CAP_DAC_READ_SEARCH`, EOPNOTSUPP, ...). About 5 µs (open, readlink, close).
pub fn cgroup_path_by_id(mount: BorrowedFd<'_>, prefix: &str, id: u64) -> std::io::Result<Option<String>> {
    let mut handle = KernfsFileHandle { handle_bytes: 8, handle_type: FILEID_KERNFS, id };
    // SAFETY: `handle` is a file_handle header followed by the `handle_bytes` (8) bytes it
    // announces; the kernel only reads it. The returned fd is owned below.
    let fd = unsafe {
        libc::open_by_handle_at(
            mount.as_raw_fd(),
            (&raw mut handle).cast::<libc::file_handle>(),
            libc::O_PATH | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ESTALE | libc::ENOENT) => Ok(None),
            _ => Err(e),
        };
    }
    // SAFETY: open_by_handle_at returned a new fd that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let Ok(path) = fd_path(fd.as_raw_fd()) else { return Ok(None) };
    Ok(relative_cgroup_path(prefix, &path))
}

/// `path` (as the kernel prints it) relative to the mount's `prefix`: `/` for the mount itself;
/// `None` for a removed directory or one outside the mount.
fn relative_cgroup_path(prefix: &str, path: &str) -> Option<String> {
    if path.ends_with(" (deleted)") {
        return None;
    }
    let rest = if prefix == "/" { path } else { path.strip_prefix(prefix)? };
    match rest {
        "" => Some("/".into()),
        r if r.starts_with('/') => Some(r.to_string()),
        _ => None,
    }
}

/// What `/proc/self/fd/N` points at.
fn fd_path(fd: RawFd) -> std::io::Result<String> {
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}"))?;
    link.into_os_string()
        .into_string()
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "cgroup path is not UTF-8"))
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
        let root = cgroup_root.or_else(|| crate::proc::cgroup2_mount(&proc_root));
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
    pub(crate) fn process_exited(&mut self, tgid: u32) {
        self.processes.remove(&tgid);
    }

    /// Is `pid` a process (its own thread group leader), not a thread?
    pub(crate) fn is_process(&self, pid: u32) -> bool {
        tgid_of(&self.proc_root, pid) == Some(pid)
    }

    /// The cgroup id of `tgid`, from `/proc/PID/cgroup` (for processes found by a scan).
    pub fn cgroup_id_of(&self, tgid: u32) -> Option<u64> {
        let rel = crate::proc::cgroup2_path(&self.proc_root, tgid)?;
        let root = self.cgroups.root()?;
        std::fs::metadata(root.join(rel.trim_start_matches('/'))).ok().map(|m| m.ino())
    }

    /// A cgroup id from a numeric id or a path relative to the cgroup2 mount. The path must stay
    /// inside the mount (no `..`) and name a cgroup there (a directory on the mount's file system):
    /// `--cgroup ../../../../etc` found the inode of /etc.
    pub fn cgroup_id(&self, path_or_id: &str) -> Option<u64> {
        use std::os::unix::fs::MetadataExt as _;
        use std::path::Component;
        if let Ok(id) = path_or_id.parse::<u64>() {
            return Some(id);
        }
        let root = self.cgroups.root()?;
        let rel = Path::new(path_or_id.trim_start_matches('/'));
        if !rel.components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir)) {
            return None;
        }
        let mount = std::fs::metadata(root).ok()?;
        let m = std::fs::metadata(root.join(rel)).ok()?;
        (m.is_dir() && m.dev() == mount.dev()).then(|| m.ino())
    }
}

/// What `/proc/PID/stat` tells about a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessInfo {
    /// Start time in clock ticks since boot (field 22).
    pub start_time_ticks: u64,
    pub comm: String,
}

/// Read start time and comm of `pid` (`/proc/PID/stat`); `None` if it is gone.
pub(crate) fn process_info(proc_root: &Path, pid: u32) -> Option<ProcessInfo> {
    crate::proc::stat(proc_root, pid).ok().map(|s| ProcessInfo::from(&s))
}

impl From<&crate::proc::Stat> for ProcessInfo {
    fn from(s: &crate::proc::Stat) -> Self {
        ProcessInfo { start_time_ticks: s.starttime, comm: s.comm.clone() }
    }
}

/// The Tgid of a task (`/proc/PID/status`), to tell a forked process from a new thread.
pub fn tgid_of(proc_root: &Path, pid: u32) -> Option<u32> {
    u32::try_from(crate::proc::status(proc_root, pid).ok()?.tgid).ok()
}

#[cfg(test)]
mod tests;
