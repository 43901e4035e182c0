//! A path is never enough (issue 13, item 5): the tracer must not trace, and charge, a file that is
//! merely *called* `nvidiactl`. An unprivileged user (uid 65534) in its own user and mount
//! namespace puts a tmpfs over the agent's device directory and makes its own `nvidiactl`; before
//! the fix its ioctls were traced like a GPU process's. Each test has a control that is traced, so
//! a test that traced nothing at all would fail.
//!
//! The device directory is a plain directory here (no fake driver): ioctls on its regular files
//! fail with `ENOTTY`, but the kernel side traces the call on a tracked fd all the same, so the
//! ioctl probe's `seen` counter tells exactly which calls were traced.
use std::{
    io::{BufRead, BufReader, Write},
    path::Path,
    process::{Child, Command, Stdio},
    sync::Mutex,
};

use gpu_tracer_tests::{Tracer, require_root};
use tracer_common::counter;
use tracer_core::{
    config::{Config, Families},
    model::{AgentSnapshot, counters::ProbeCounters},
};

static SERIAL: Mutex<()> = Mutex::new(());

const IOCTLS: u64 = 500;

/// `_IOWR('F', 0x2b, NVOS64_PARAMETERS)`: RM_ALLOC.
const RM_ALLOC: u64 = 0xc030_462b;

fn config(dev_dir: &Path, simulated: bool) -> Config {
    Config {
        dev_dir: dev_dir.to_path_buf(),
        simulated_devices: simulated,
        driver_version: Some("535.261.03".into()),
        families: Families { cuda: false, ..Default::default() },
        ..Config::default()
    }
}

fn probe(s: &AgentSnapshot, name: &str) -> ProbeCounters {
    s.kernel.probes.iter().find(|(n, _)| n == name).map(|(_, c)| *c).unwrap_or_default()
}

/// A Python program that opens `path`, says `open`, waits for a line on stdin, makes `IOCTLS`
/// RM_ALLOC ioctls on it and says `done`.
fn ioctl_program(path: &Path) -> String {
    format!(
        "import os, fcntl, sys\n\
         fd = os.open({path:?}, os.O_RDWR)\n\
         print('open', flush=True)\n\
         sys.stdin.readline()\n\
         for _ in range({IOCTLS}):\n\
         \x20   try: fcntl.ioctl(fd, {RM_ALLOC}, bytes(48))\n\
         \x20   except OSError: pass\n\
         print('done', flush=True)\n",
        path = path.display().to_string()
    )
}

/// A process that has opened its file and waits (see [`ioctl_program`]).
struct Caller {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
}

impl Caller {
    fn spawn(mut cmd: Command) -> Caller {
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("spawn the caller");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "open", "the caller could not open its file (see stderr)");
        Caller { child, out }
    }

    /// Make the ioctls and wait for the process to exit.
    fn run(mut self) {
        self.child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "done");
        drop(self.child.stdin.take());
        assert!(self.child.wait().unwrap().success());
    }
}

/// Root, in the host's namespaces: opens `dir/nvidiactl`.
fn root_caller(dir: &Path) -> Caller {
    let mut cmd = Command::new("python3");
    cmd.arg("-c").arg(ioctl_program(&dir.join("nvidiactl")));
    Caller::spawn(cmd)
}

/// uid 65534 in its own user and mount namespace, with a tmpfs over `dir` and its own regular file
/// `dir/nvidiactl`: what any user of the node can do.
fn spoofer(dir: &Path) -> Caller {
    let script = format!("mount -t tmpfs none {d} && : > {d}/nvidiactl && exec python3 -c \"$0\"", d = dir.display());
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .args(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", &script])
        .arg(ioctl_program(&dir.join("nvidiactl")));
    Caller::spawn(cmd)
}

/// A world-readable directory with a regular file `nvidiactl`, standing in for a device directory.
fn device_dir() -> tempfile::TempDir {
    let d = tempfile::Builder::new().prefix("gt-spoof-").tempdir_in("/tmp").unwrap();
    std::fs::set_permissions(d.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::write(d.path().join("nvidiactl"), b"").unwrap();
    d
}

#[test]
fn an_unprivileged_users_own_nvidiactl_is_not_traced() {
    require_root();
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = device_dir();
    // The directory's own file is trusted as a simulated device (as the fake driver's are).
    let mut t = Tracer::start(config(dir.path(), true));

    // Control: the trusted file is traced, every call.
    root_caller(dir.path()).run();
    let s = t.settle();
    let trusted_traced = probe(&s, "ioctl").seen;
    println!("reliability: trusted_ioctls={IOCTLS} trusted_traced={trusted_traced}");
    assert_eq!(probe(&s, "ioctl").seen, IOCTLS, "the trusted file's ioctls are traced");
    assert_eq!(probe(&s, "open").dropped_at(counter::DROP_NOT_A_DEVICE), 0);

    // The spoofer: same path, its own file. Nothing traced; the refused open is counted.
    spoofer(dir.path()).run();
    let s = t.settle();
    println!(
        "reliability: spoofer_ioctls={IOCTLS} spoofer_traced={} refused_opens={}",
        probe(&s, "ioctl").seen.saturating_sub(trusted_traced),
        probe(&s, "open").dropped_at(counter::DROP_NOT_A_DEVICE)
    );
    assert_eq!(probe(&s, "ioctl").seen, IOCTLS, "not one of the spoofer's ioctls may be traced");
    // Two refused opens: the shell creating the file (`: >`) and Python opening it.
    assert_eq!(probe(&s, "open").dropped_at(counter::DROP_NOT_A_DEVICE), 2, "the refused opens are counted");
    assert!(s.accounting.exact, "{:?}", s.accounting);
}

#[test]
fn without_simulated_devices_only_nvidia_character_devices_count() {
    require_root();
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = device_dir();
    // A character device with the wrong major (1:3, /dev/null's) under an NVIDIA name.
    let null = dir.path().join("nvidia0");
    let st = Command::new("mknod").arg(&null).args(["c", "1", "3"]).status().unwrap();
    assert!(st.success(), "mknod");
    let mut t = Tracer::start(config(dir.path(), false));
    root_caller(dir.path()).run();
    let mut cmd = Command::new("python3");
    cmd.arg("-c").arg(ioctl_program(&null));
    Caller::spawn(cmd).run();
    let s = t.settle();
    println!(
        "reliability: ioctls_made={} traced={} refused_opens={} processes_tracked={}",
        2 * IOCTLS,
        probe(&s, "ioctl").seen,
        probe(&s, "open").dropped_at(counter::DROP_NOT_A_DEVICE),
        s.state.processes.len()
    );
    assert_eq!(probe(&s, "ioctl").seen, 0, "a regular file and a 1:3 device are not NVIDIA devices");
    assert_eq!(probe(&s, "open").dropped_at(counter::DROP_NOT_A_DEVICE), 2);
    assert!(s.state.processes.is_empty(), "{:?}", s.state.processes);
}

#[test]
fn a_spoofed_fd_opened_before_the_agent_is_not_seeded() {
    require_root();
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = device_dir();
    // Both open before the agent starts: the /proc scan finds them by path.
    let trusted = root_caller(dir.path());
    let spoof = spoofer(dir.path());
    let mut t = Tracer::start(config(dir.path(), true));
    let s = t.settle();
    println!("reliability: seeded_fds={} scan_refused={}", s.pipeline.seeded_fds, s.pipeline.scan_not_devices);
    assert_eq!(s.pipeline.seeded_fds, 1, "the trusted file is seeded");
    assert_eq!(s.pipeline.scan_not_devices, 1, "the spoofed fd is found by path and refused");
    trusted.run();
    spoof.run();
    let s = t.settle();
    println!("reliability: ioctls_made={} traced={}", 2 * IOCTLS, probe(&s, "ioctl").seen);
    assert_eq!(probe(&s, "ioctl").seen, IOCTLS, "only the trusted file's ioctls are traced");
}
