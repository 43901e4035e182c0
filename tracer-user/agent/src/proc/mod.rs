//! One typed way to read `/proc`, under the configured `proc_root` (the host's procfs mounted into
//! the agent's container is `/host/proc`), through the `procfs` crate.
//!
//! - One file per call, read by path (`<proc_root>/<pid>/stat`): each caller needs one file of a
//!   process, and procfs's `Process` (a directory fd held open, files read relative to it) costs
//!   two more syscalls per process for a guarantee one read already has. A process that exits
//!   reads as [`ProcError::NotFound`], which the caller counts.
//! - The parsers are procfs-core's: `stat` with a command name holding spaces and parentheses,
//!   `status`, `cgroup`, `maps`, `mountinfo`, `/proc/devices`. Text fixtures in tests go through the
//!   same parsers ([`parse`]).
//! - Every parse runs under [`guard`]: procfs-core slices some lines by position and panics on text
//!   the kernel never writes but a fake or damaged `proc_root` can hold, or a container can cause
//!   (a file it maps at `/SYSV` makes the `maps` parser index past the end). A panic there becomes
//!   an error the caller counts like an unreadable process; the agent never goes down for it.
//! - Not through procfs, on purpose (docs/dependencies.md): the start-up scan's fd walk
//!   (`source::procscan`: procfs's fd iterator opens, reads and stats every fd, 4 syscalls where a
//!   `readlink` is 1; measured 25% slower at 2,000 processes), `environ` (procfs returns every
//!   entry; the guardrails read two and must never hold the rest), existence checks of
//!   `task/<tid>` (one `stat`), single-value sysctls procfs has no reader for (`hostname`,
//!   `perf_event_paranoid`), and mountinfo's octal escapes (procfs keeps `\040` as is;
//!   [`cgroup2_mount`] unescapes the mount point).
use std::{
    ffi::OsString,
    fmt::Display,
    os::unix::ffi::{OsStrExt, OsStringExt},
    path::{Path, PathBuf},
};

pub use procfs::{
    FromBufRead, FromRead, ProcError,
    process::{MMapPath, Process, Stat, Status},
};
use procfs::{
    ProcessCGroups,
    process::{MemoryMaps, MountInfos},
};

/// Run a procfs read or parse; a panic inside it becomes [`ProcError::Other`].
pub fn guard<T>(what: &str, f: impl FnOnce() -> Result<T, ProcError>) -> Result<T, ProcError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|_| Err(ProcError::Other(format!("malformed {what}: the procfs parser rejected it"))))
}

/// `<proc_root>/<pid>/<name>`; `pid` may be `"self"`.
fn file(proc_root: &Path, pid: impl Display, name: &str) -> PathBuf {
    proc_root.join(pid.to_string()).join(name)
}

/// `/proc/PID/stat`. A process that is gone is [`ProcError::NotFound`].
pub fn stat(proc_root: &Path, pid: impl Display) -> Result<Stat, ProcError> {
    let path = file(proc_root, pid, "stat");
    guard("stat", || Stat::from_file(&path))
}

/// `stat` of a process opened with [`myself`].
pub(crate) fn read_stat(p: &Process) -> Result<Stat, ProcError> {
    guard("stat", || p.stat())
}

/// `/proc/PID/status`.
pub fn status(proc_root: &Path, pid: impl Display) -> Result<Status, ProcError> {
    let path = file(proc_root, pid, "status");
    guard("status", || Status::from_file(&path))
}

/// The cgroup v2 path of a process, relative to the cgroup2 mount (`0::/path` in `cgroup`).
pub fn cgroup2_path(proc_root: &Path, pid: impl Display) -> Option<String> {
    let path = file(proc_root, pid, "cgroup");
    cgroup2_of(guard("cgroup", || ProcessCGroups::from_file(&path)).ok()?)
}

fn cgroup2_of(groups: ProcessCGroups) -> Option<String> {
    groups.into_iter().find(|g| g.hierarchy == 0 && g.controllers.is_empty()).map(|g| g.pathname)
}

/// The files a process maps (`maps`), as paths in its own mount namespace. A file deleted since
/// it was mapped is left out: its path names another file now, or none.
pub(crate) fn mapped_files(proc_root: &Path, pid: impl Display) -> Result<Vec<PathBuf>, ProcError> {
    let path = file(proc_root, pid, "maps");
    Ok(files_of(guard("maps", || MemoryMaps::from_file(&path))?))
}

/// The libcuda files `tgid` maps, as paths through its root (`/proc/PID/root/...`).
pub(crate) fn mapped_libcuda(proc_root: &Path, tgid: u32) -> Vec<PathBuf> {
    let Ok(files) = mapped_files(proc_root, tgid) else { return Vec::new() };
    let mut paths: Vec<PathBuf> = files
        .into_iter()
        .filter(|p| p.file_name().and_then(|f| f.to_str()).is_some_and(|f| f.starts_with("libcuda.so")))
        .collect();
    paths.dedup();
    let root = proc_root.join(format!("{tgid}/root"));
    paths.into_iter().map(|p| root.join(p.strip_prefix("/").unwrap_or(&p))).collect()
}

fn files_of(maps: MemoryMaps) -> Vec<PathBuf> {
    maps.into_iter()
        .filter_map(|m| match m.pathname {
            MMapPath::Path(p) if !p.as_os_str().to_string_lossy().ends_with(" (deleted)") => Some(p),
            _ => None,
        })
        .collect()
}

/// `<proc_root>/self`, opened: the reading process as the mounted procfs sees it.
pub(crate) fn myself(proc_root: &Path) -> Result<Process, ProcError> {
    Process::new_with_root(proc_root.join("self"))
}

/// One line of a mount table, with mountinfo's octal escapes undone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    pub point: PathBuf,
    /// `ext4`, `cgroup2`, `fuse.<subtype>`, ...
    pub fs_type: String,
    /// The mount source (`/dev/vda1`, a FUSE file system's `fsname`).
    pub source: Option<String>,
}

/// The mount table of `<proc_root>/self` (`mountinfo`); empty when it cannot be read.
pub fn mounts(proc_root: &Path) -> Vec<Mount> {
    let path = file(proc_root, "self", "mountinfo");
    guard("mountinfo", || MountInfos::from_file(&path)).map(mounts_of).unwrap_or_default()
}

fn mounts_of(infos: MountInfos) -> Vec<Mount> {
    infos
        .into_iter()
        .map(|m| Mount {
            point: PathBuf::from(unescape_octal(m.mount_point.as_os_str().as_bytes())),
            fs_type: m.fs_type,
            source: m.mount_source.map(|s| unescape_octal(s.as_bytes()).to_string_lossy().into_owned()),
        })
        .collect()
}

/// The cgroup v2 mount point the mount table of `<proc_root>/self` names (the first one).
pub fn cgroup2_mount(proc_root: &Path) -> Option<PathBuf> {
    mounts(proc_root).into_iter().find(|m| m.fs_type == "cgroup2").map(|m| m.point)
}

/// mountinfo writes space, tab, newline and backslash in paths as `\ooo` octal escapes; procfs
/// leaves them as they are.
fn unescape_octal(b: &[u8]) -> OsString {
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b.get(i..i + 4) {
            Some([b'\\', d @ ..]) if d.iter().all(|c| (b'0'..=b'7').contains(c)) => {
                let v = u32::from(d[0] - b'0') * 64 + u32::from(d[1] - b'0') * 8 + u32::from(d[2] - b'0');
                out.push(v as u8);
                i += 4;
            }
            _ => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    OsString::from_vec(out)
}

/// The boot time in seconds since the epoch (`btime` of `/proc/stat`), read once.
pub(crate) fn boot_time_secs() -> Option<u64> {
    procfs::boot_time_secs().ok()
}

/// The kernel's `pid_max`.
pub fn pid_max() -> Option<u64> {
    procfs::sys::kernel::pid_max().ok().and_then(|v| u64::try_from(v).ok())
}

/// The character devices of `<proc_root>/devices` as (major, name).
pub(crate) fn char_devices(proc_root: &Path) -> Option<Vec<(u32, String)>> {
    let d = guard("devices", || procfs::Devices::from_file(proc_root.join("devices"))).ok()?;
    Some(d.char_devices.into_iter().map(|c| (c.major, c.name)).collect())
}

/// The kernel release (`/proc/sys/kernel/osrelease`), e.g. `6.1.0-18-amd64`; empty if unreadable.
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).unwrap_or_default()
}

/// The `major.minor` of a kernel release (`6.1.0-18-amd64` → (6, 1)); `None` if it has none.
pub fn kernel_series(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(|c: char| !c.is_ascii_digit()).filter_map(|p| p.parse::<u32>().ok());
    Some((it.next()?, it.next()?))
}

/// True when `release` is `major.minor` or newer; unknown: false.
pub fn kernel_at_least(release: &str, major: u32, minor: u32) -> bool {
    kernel_series(release).is_some_and(|v| v >= (major, minor))
}

/// True when `release` is older than `major.minor`; unknown: false (neither older nor newer).
pub fn kernel_before(release: &str, major: u32, minor: u32) -> bool {
    kernel_series(release).is_some_and(|v| v < (major, minor))
}

/// The same parsers on text (tests, fixtures, the doubles).
pub mod parse {
    use super::*;

    pub fn stat(text: &str) -> Option<Stat> {
        guard("stat", || Stat::from_read(text.as_bytes())).ok()
    }

    pub fn status(text: &str) -> Option<Status> {
        guard("status", || Status::from_read(text.as_bytes())).ok()
    }

    pub fn cgroup2_path(text: &str) -> Option<String> {
        cgroup2_of(guard("cgroup", || ProcessCGroups::from_buf_read(text.as_bytes())).ok()?)
    }

    pub fn mounts(text: &str) -> Option<Vec<Mount>> {
        Some(mounts_of(guard("mountinfo", || MountInfos::from_buf_read(text.as_bytes())).ok()?))
    }

    #[cfg(test)]
    pub(crate) fn mapped_files(text: &str) -> Option<Vec<PathBuf>> {
        Some(files_of(guard("maps", || MemoryMaps::from_buf_read(text.as_bytes())).ok()?))
    }

    #[cfg(test)]
    pub(crate) fn char_devices(text: &str) -> Option<Vec<(u32, String)>> {
        let d = guard("devices", || procfs::Devices::from_buf_read(text.as_bytes())).ok()?;
        Some(d.char_devices.into_iter().map(|c| (c.major, c.name)).collect())
    }
}

#[cfg(test)]
pub(crate) mod tests;
