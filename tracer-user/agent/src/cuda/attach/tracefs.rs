//! Uprobes created through tracefs (`uprobe_events`), the fallback where the kernel refuses
//! `perf_event_open` on the uprobe PMU: kernels before 6.6 (no multi-uprobe links) without
//! CAP_SYS_ADMIN. This is what bpftrace does after the same refusal: write the probe to
//! `<tracefs>/uprobe_events`, open the trace event it creates as a tracepoint perf event (CAP_PERFMON
//! suffices unless `kernel.perf_event_paranoid` is 3 or more on a kernel with Debian's or Ubuntu's
//! patch), and attach the program to it with a `BPF_LINK_CREATE` perf link, which carries the
//! entry id as the cookie like the other paths.
//!
//! Events are named `gpu_tracer/p<agent pid>_<n>`; each is removed when its link is dropped, and
//! those of agents that are gone (killed before they could remove theirs) are removed at the next
//! start ([`remove_stale`]).
use std::{
    fs::OpenOptions,
    io::Write,
    os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd},
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
};

/// The trace-event group of our probes.
pub(crate) const GROUP: &str = "gpu_tracer";

/// Where tracefs is looked for.
pub(crate) const ROOTS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// The tracefs mount with a `uprobe_events` file, if any.
pub fn root() -> Option<PathBuf> {
    ROOTS.iter().map(PathBuf::from).find(|p| p.join("uprobe_events").exists())
}

const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PERF_EVENT: u32 = 41;
const PERF_TYPE_TRACEPOINT: u32 = 2;
/// `PERF_EVENT_IOC_SET_BPF` = `_IOW('$', 8, __u32)` and `PERF_EVENT_IOC_ENABLE` = `_IO('$', 0)`
/// (linux/perf_event.h).
const PERF_EVENT_IOC_SET_BPF: libc::c_ulong = 0x4004_2408;
const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;
/// `PERF_FLAG_FD_CLOEXEC` (linux/perf_event.h).
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;

/// `struct perf_event_attr` up to `config1` (`PERF_ATTR_SIZE_VER0`, 64 bytes; the kernel takes
/// the rest as zero).
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    type_: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
}

/// `union bpf_attr` for `BPF_LINK_CREATE` of a perf-event link.
#[repr(C)]
#[derive(Default)]
struct PerfLinkAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    bpf_cookie: u64,
}

static NEXT: AtomicU64 = AtomicU64::new(0);

/// One uprobe made through tracefs, attached; dropping it detaches it and removes the event.
pub struct TracefsProbe {
    link: Option<OwnedFd>,
    perf: Option<OwnedFd>,
    /// Held for its `Drop`, which runs after this struct's has closed the fds.
    _event: Event,
}

impl Drop for TracefsProbe {
    fn drop(&mut self) {
        // The event can be removed only once nothing holds it open.
        drop(self.link.take());
        drop(self.perf.take());
    }
}

/// A trace event of ours in `uprobe_events`, removed when dropped (after the fds using it closed:
/// see [`TracefsProbe`]'s field order).
struct Event {
    root: PathBuf,
    name: String,
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Err(e) = write_events(&self.root, &format!("-:{GROUP}/{}", self.name)) {
            tracing::warn!(event = %self.name, error = %e, "could not remove our uprobe event from tracefs");
        }
    }
}

/// Append `line` to `<root>/uprobe_events` (appending: opening it for writing without O_APPEND
/// would clear every uprobe event on the machine).
fn write_events(root: &Path, line: &str) -> std::io::Result<()> {
    let mut f = OpenOptions::new().append(true).open(root.join("uprobe_events"))?;
    f.write_all(format!("{line}\n").as_bytes())
}

/// Attach `prog` (a loaded uprobe program) at `offset` of `lib` through tracefs at `root`, as a
/// return probe with `ret`, with `cookie` (`None`: the per-entry programs of kernels without attach
/// cookies; where the kernel has no perf links either, before 5.15, the program is attached with
/// `PERF_EVENT_IOC_SET_BPF` and detached when the perf event is closed).
pub fn attach(
    root: &Path,
    prog: BorrowedFd<'_>,
    lib: &Path,
    offset: u64,
    ret: bool,
    cookie: Option<u64>,
) -> Result<TracefsProbe, String> {
    let path = lib
        .to_str()
        .filter(|p| !p.contains(char::is_whitespace))
        .ok_or_else(|| format!("{}: tracefs cannot name a path with spaces or that is not UTF-8", lib.display()))?;
    let name = format!("p{}_{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
    let kind = if ret { 'r' } else { 'p' };
    write_events(root, &format!("{kind}:{GROUP}/{name} {path}:{offset:#x}"))
        .map_err(|e| format!("writing {}: {e}", root.join("uprobe_events").display()))?;
    // From here on the event is removed again if anything fails.
    let event = Event { root: root.to_path_buf(), name };
    let id_file = root.join("events").join(GROUP).join(&event.name).join("id");
    let id: u64 = std::fs::read_to_string(&id_file)
        .map_err(|e| format!("reading {}: {e}", id_file.display()))?
        .trim()
        .parse()
        .map_err(|e| format!("{}: {e}", id_file.display()))?;
    let mut attr = PerfEventAttr {
        type_: PERF_TYPE_TRACEPOINT,
        size: size_of::<PerfEventAttr>() as u32,
        config: id,
        sample_period: 1,
        wakeup_events: 1,
        ..Default::default()
    };
    // SAFETY: `attr` is a live `perf_event_attr` prefix whose `size` says how long it is; pid -1 and
    // cpu 0 (every process, as a tracepoint event is); the kernel returns a new fd or -1.
    let fd = unsafe {
        libc::syscall(libc::SYS_perf_event_open, &mut attr as *mut PerfEventAttr, -1, 0, -1, PERF_FLAG_FD_CLOEXEC)
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!("perf_event_open of tracepoint {GROUP}/{}: {e}", event.name));
    }
    // SAFETY: the kernel just returned this fd to us; nothing else owns it.
    let perf = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    let mut link = PerfLinkAttr {
        prog_fd: prog.as_raw_fd() as u32,
        target_fd: perf.as_raw_fd() as u32,
        attach_type: BPF_PERF_EVENT,
        bpf_cookie: cookie.unwrap_or(0),
        ..Default::default()
    };
    // SAFETY: `link` is a live, fully initialised `repr(C)` prefix of `union bpf_attr` for
    // BPF_LINK_CREATE, passed with its size; the kernel returns a new fd or -1.
    let fd = unsafe {
        libc::syscall(libc::SYS_bpf, BPF_LINK_CREATE, &mut link as *mut PerfLinkAttr, size_of::<PerfLinkAttr>() as u32)
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        if cookie.is_none() && e.raw_os_error() == Some(libc::EINVAL) {
            // No perf links (before 5.15): the program goes on the event itself.
            // SAFETY: ioctls on the perf event fd this function owns, with a program fd.
            let set = unsafe { libc::ioctl(perf.as_raw_fd(), PERF_EVENT_IOC_SET_BPF, prog.as_raw_fd()) };
            // SAFETY: as above.
            if set == 0 && unsafe { libc::ioctl(perf.as_raw_fd(), PERF_EVENT_IOC_ENABLE, 0) } == 0 {
                return Ok(TracefsProbe { link: None, perf: Some(perf), _event: event });
            }
            let e2 = std::io::Error::last_os_error();
            return Err(format!(
                "BPF_LINK_CREATE perf_event on {GROUP}/{}: {e}; PERF_EVENT_IOC_SET_BPF: {e2}",
                event.name
            ));
        }
        return Err(format!("BPF_LINK_CREATE perf_event on {GROUP}/{}: {e}", event.name));
    }
    // SAFETY: as above.
    let link = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    Ok(TracefsProbe { link: Some(link), perf: Some(perf), _event: event })
}

/// Our events left behind by agents that are gone (killed before they could remove theirs):
/// `p<pid>_<n>` of a pid that no longer runs. Removes them; returns how many.
pub(crate) fn remove_stale(root: &Path, proc_root: &Path) -> usize {
    let Ok(text) = std::fs::read_to_string(root.join("uprobe_events")) else { return 0 };
    let mut removed = 0;
    for name in stale(&text, |pid| proc_root.join(pid.to_string()).exists()) {
        match write_events(root, &format!("-:{GROUP}/{name}")) {
            Ok(()) => removed += 1,
            Err(e) => tracing::warn!(event = %name, error = %e, "could not remove a stale uprobe event of ours"),
        }
    }
    if removed > 0 {
        tracing::info!(removed, "removed uprobe events left in tracefs by a gpu-tracer that is gone");
    }
    removed
}

/// The names of our events in `uprobe_events` text whose agent is not `alive`.
fn stale(text: &str, alive: impl Fn(u32) -> bool) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter_map(|head| head.split_once(':').map(|(_, ev)| ev))
        .filter_map(|ev| ev.strip_prefix(GROUP).and_then(|r| r.strip_prefix('/')))
        .filter(|name| {
            name.strip_prefix('p')
                .and_then(|r| r.split_once('_'))
                .and_then(|(pid, _)| pid.parse::<u32>().ok())
                .is_some_and(|pid| !alive(pid))
        })
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn stale_events_are_ours_of_agents_that_are_gone() {
        let text = "p:gpu_tracer/p100_0 /lib/libcuda.so.1:0x31af\n\
                    r:gpu_tracer/p100_1 /lib/libcuda.so.1:0x3000\n\
                    p:gpu_tracer/p200_0 /lib/libcuda.so.1:0x31af\n\
                    p:uprobes/p_bash_0x4 /bin/bash:0x0000000000000004\n\
                    p:gpu_tracer_other/p100_0 /x:0x1\n";
        assert_eq!(super::stale(text, |pid| pid == 200), vec!["p100_0", "p100_1"]);
    }
}
