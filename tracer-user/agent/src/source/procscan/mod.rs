//! The start-up scan: processes that opened NVIDIA device nodes before the agent started are found
//! through `/proc/*/fd`, their fds are written into the kernel's `NV_FDS` map (so their ioctls are
//! traced from now on), and synthetic open records (flag `SEEDED`) feed the same decoder as live
//! ones. Dups are recognised with `kcmp(KCMP_FILE)` so they share a `file_id`.
use std::{collections::HashMap, path::Path};

use crate::probe::devcheck::Accepted;
use tracer_common::{DeviceRef, EventHeader, FdKey, FdOpenRecord, device_kind, flags, kind};

/// Classify `path` against the device prefix (`<dev_dir>/nvidia`), like the kernel side does.
pub fn classify_device_path(prefix: &str, path: &str) -> Option<DeviceRef> {
    let sfx = path.strip_prefix(prefix)?;
    let mut dev = DeviceRef::default();
    match sfx {
        "ctl" => dev.kind = device_kind::CTL,
        "-uvm" => dev.kind = device_kind::UVM,
        "-uvm-tools" => dev.kind = device_kind::UVM_TOOLS,
        "-modeset" => dev.kind = device_kind::MODESET,
        s if s.starts_with("-caps/") => {
            dev.kind = device_kind::CAPS;
            let digits: String = s.chars().rev().take_while(|c| c.is_ascii_digit()).collect();
            dev.minor = digits.chars().rev().collect::<String>().parse().unwrap_or(0);
        }
        s if !s.is_empty() && s.len() <= 4 && s.bytes().all(|b| b.is_ascii_digit()) => {
            dev.kind = device_kind::GPU;
            dev.minor = s.parse().ok()?;
        }
        _ => return None,
    }
    Some(dev)
}

/// One NVIDIA fd found by the scan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeededFd {
    pub tgid: u32,
    pub fd: u32,
    pub dev: DeviceRef,
}

/// What a scan found.
#[derive(Debug, Default)]
pub struct Scan {
    pub found: Vec<SeededFd>,
    /// Processes that vanished or could not be read during the scan.
    pub unreadable: u64,
    /// Fds whose path names an NVIDIA node but whose file is not an NVIDIA device
    /// ([`Accepted`](crate::probe::devcheck::Accepted)): not tracked.
    pub not_devices: u64,
}

impl Scan {
    fn add(&mut self, other: Scan) {
        self.found.extend(other.found);
        self.unreadable += other.unreadable;
        self.not_devices += other.not_devices;
    }
}

/// Scan `proc_root` for NVIDIA fds, skipping `skip_tgid` (the agent itself). Processes that vanish
/// or cannot be read during the scan are skipped and counted.
pub fn scan(proc_root: &Path, prefix: &str, accepted: &Accepted, skip_tgid: u32) -> Scan {
    let mut out = Scan::default();
    let Ok(rd) = std::fs::read_dir(proc_root) else {
        out.unreadable = 1;
        return out;
    };
    for ent in rd.flatten() {
        let Some(tgid) = ent.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if tgid == skip_tgid {
            continue;
        }
        out.add(scan_one(proc_root, prefix, accepted, tgid));
    }
    out
}

/// Scan one process's fds (e.g. a freshly forked child). An fd counts when its link names a node
/// under `prefix` **and** the file it refers to is an NVIDIA device by `accepted`'s rule (the same
/// as the kernel's at open). A directory listing and one `readlink` per fd, not the procfs crate:
/// its fd iterator opens, reads and stats every fd (4 syscalls for our 1) and made this scan 25%
/// slower at 2,000 processes (docs/benchmarks.md §11); nothing here needs parsing.
pub(crate) fn scan_one(proc_root: &Path, prefix: &str, accepted: &Accepted, tgid: u32) -> Scan {
    let mut out = Scan::default();
    let fd_dir = proc_root.join(tgid.to_string()).join("fd");
    let Ok(fds) = std::fs::read_dir(&fd_dir) else {
        out.unreadable = 1;
        return out;
    };
    for f in fds.flatten() {
        let Some(fd) = f.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(target) = std::fs::read_link(f.path()) else { continue };
        let Some(dev) = classify_device_path(prefix, &target.to_string_lossy()) else { continue };
        // metadata() follows the magic link to the file itself, in the process's mount namespace.
        match std::fs::metadata(f.path()) {
            Ok(m) if accepted.accepts(dev.kind, &m) => out.found.push(SeededFd { tgid, fd, dev }),
            Ok(_) => out.not_devices += 1,
            Err(_) => continue,
        }
    }
    assign_file_ids(tgid, &mut out.found);
    out
}

/// Give fds of one process that share an open file description (dups) the same `file_id`.
fn assign_file_ids(tgid: u32, fds: &mut [SeededFd]) {
    // High bit marks seeded ids so they never collide with kernel-assigned ones in practice.
    let base = (1u64 << 63) | ((tgid as u64) << 24);
    let mut groups: Vec<(u32, u64)> = Vec::new(); // representative fd, file_id
    for f in fds.iter_mut() {
        let fd = f.fd;
        let same = groups.iter().find(|(rep, _)| kcmp_same_file(tgid, *rep, fd) == Some(true));
        let id = match same {
            Some((_, id)) => *id,
            None => {
                let id = base | fd as u64;
                groups.push((fd, id));
                id
            }
        };
        f.dev.file_id = id;
    }
}

/// `kcmp(pid, pid, KCMP_FILE, a, b) == 0`: the two fds refer to the same open file description.
fn kcmp_same_file(tgid: u32, a: u32, b: u32) -> Option<bool> {
    const KCMP_FILE: libc::c_long = 0;
    // SAFETY: kcmp only reads kernel state; all arguments are plain integers.
    let r = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            tgid as libc::c_long,
            tgid as libc::c_long,
            KCMP_FILE,
            a as libc::c_long,
            b as libc::c_long,
        )
    };
    if r < 0 { None } else { Some(r == 0) }
}

/// Build the synthetic open record for a seeded fd (decoded like a live one).
pub(crate) fn seeded_record(s: &SeededFd, cgroup_id: u64, ktime_ns: u64) -> FdOpenRecord {
    FdOpenRecord {
        hdr: EventHeader {
            kind: kind::FD_OPEN,
            flags: flags::SEEDED,
            size: size_of::<FdOpenRecord>() as u32,
            ktime_ns,
            tgid: s.tgid,
            pid: s.tgid,
            cgroup_id,
        },
        dev: s.dev,
        fd: s.fd as i32,
        open_flags: 0,
    }
}

/// The `NV_FDS` key of a seeded fd.
pub fn key(s: &SeededFd) -> FdKey {
    FdKey { tgid: s.tgid, fd: s.fd }
}

/// Count seeded fds per process (for logs).
pub fn per_process(seeded: &[SeededFd]) -> HashMap<u32, usize> {
    let mut m = HashMap::new();
    for s in seeded {
        *m.entry(s.tgid).or_insert(0) += 1;
    }
    m
}

#[cfg(test)]
mod tests;
