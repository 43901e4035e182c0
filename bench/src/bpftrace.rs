//! bpftrace as the yardstick: the same calls counted by a one-line bpftrace program.
use std::{
    io::{BufRead, BufReader, Read},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};

/// Counts RM_ALLOC (NVOS64) ioctls per cgroup, on the syscall tracepoint.
pub const PROGRAM: &str = "tracepoint:syscalls:sys_enter_ioctl /args->cmd == 0xc030462b/ { @[cgroup] = count(); }";

/// Is bpftrace on PATH?
pub fn available() -> bool {
    Command::new("bpftrace").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
}

struct Guard(Child);
impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Counts `cuLaunchKernel` calls through `lib` per cgroup, with a uprobe on the symbol.
pub fn cuda_program(lib: &str) -> String {
    format!("uprobe:{lib}:cuLaunchKernel {{ @[cgroup] = count(); }}")
}

/// Run `f` while bpftrace is attached; returns `f`'s result and the total count bpftrace printed.
pub fn while_attached<T>(ctx: &crate::Ctx, f: impl FnOnce() -> Result<T>) -> Result<(T, u64)> {
    while_attached_program(ctx, PROGRAM, f)
}

/// [`while_attached`] with another bpftrace program whose only map is `@[...] = count()`.
pub fn while_attached_program<T>(ctx: &crate::Ctx, program: &str, f: impl FnOnce() -> Result<T>) -> Result<(T, u64)> {
    let child = Command::new("bpftrace")
        .args(["-e", program])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => Guard(c),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!("bpftrace not installed"),
        Err(e) => return Err(e).context("starting bpftrace"),
    };
    let stdout = child.0.stdout.take().context("bpftrace stdout")?;
    let mut stderr = child.0.stderr.take().context("bpftrace stderr")?;
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    // "Attaching 1 probe..." is printed before attaching; the probe is in place shortly after.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) if l.starts_with("Attaching") => break,
            Ok(_) => {}
            Err(_) => {
                let _ = child.0.kill();
                let _ = child.0.wait();
                let err = err_thread.join().unwrap_or_default();
                bail!("bpftrace did not attach: {}", err.trim());
            }
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    ctx.expected_tracer_pids.borrow_mut().push(child.0.id());
    let out = f();
    ctx.note_ours();
    ctx.expected_tracer_pids.borrow_mut().clear();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.0.id() as i32, libc::SIGINT) };
    // It usually exits within a fraction of a second; detaching waits for RCU grace periods, which
    // other work on the machine can stretch.
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.0.try_wait()?.is_none() {
        if Instant::now() > deadline {
            let pid = child.0.id();
            let read = |f: &str| std::fs::read_to_string(format!("/proc/{pid}/{f}")).unwrap_or_default();
            let state = read("status").lines().find_map(|l| l.strip_prefix("State:")).unwrap_or("?").trim().to_string();
            bail!("bpftrace did not exit within 30 s of SIGINT (state {state}, waiting in {})", read("wchan").trim());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = out?;
    let mut total = 0u64;
    let mut seen_map = false;
    while let Ok(l) = rx.recv_timeout(Duration::from_secs(2)) {
        // "@[4026531835]: 1050000"
        if let Some((_, n)) = l.strip_prefix("@[").and_then(|r| r.split_once("]: ")) {
            total += n.trim().parse::<u64>().map_err(|_| anyhow!("unexpected bpftrace output line {l:?}"))?;
            seen_map = true;
        }
    }
    if !seen_map {
        let err = err_thread.join().unwrap_or_default();
        bail!("bpftrace printed no counts (stderr: {})", err.trim());
    }
    Ok((out, total))
}
