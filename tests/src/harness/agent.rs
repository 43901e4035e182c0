//! `gpu-tracer` as a child process: where the binary is ([`gpu_tracer`]), a guard that stops a
//! child when it goes out of scope ([`ChildGuard`]), and [`AgentProcess`], a long-running
//! `gpu-tracer` child (`agent`, `profile`, `events`, ...) whose log is collected, whose readiness
//! is read from that log, and which is stopped and reaped on drop.

use std::{
    ffi::OsStr,
    io::{BufRead, BufReader, Read},
    ops::{Deref, DerefMut},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Output, Stdio},
    sync::{Arc, Condvar, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use super::{HarnessError, Result, locate_binary, scaled, signal};

/// How long [`AgentProcess`]'s waits last by default (stretched by [`super::time_scale`]): far
/// more than a start takes (about a second here), so only a failure ever waits this long.
pub const DEFAULT_PATIENCE: Duration = Duration::from_secs(60);

/// How long an [`AgentProcess`] has to exit after SIGTERM before it is killed (stretched by
/// [`super::time_scale`]): detaching the probes takes a second or two.
pub const STOP_GRACE: Duration = Duration::from_secs(15);

/// The log lines shown when a wait fails.
const SHOWN_LINES: usize = 200;

/// The `gpu-tracer` binary ([`locate_binary`]); the error names the command that builds it.
pub fn gpu_tracer_binary() -> Result<PathBuf> {
    locate_binary("gpu-tracer")
}

/// The `gpu-tracer` binary, or a panic saying how to build it (`cargo build --release -p
/// gpu-tracer`, or `cargo xtask test`).
pub fn gpu_tracer() -> PathBuf {
    gpu_tracer_binary().unwrap_or_else(|e| panic!("{e}"))
}

/// A child process stopped and reaped when dropped: killed at once by default, or, with a
/// [`ChildGuard::grace`], sent SIGTERM and killed only if it has not exited within it. A test that
/// fails leaves nothing running. Derefs to the [`Child`].
#[derive(Debug)]
pub struct ChildGuard {
    child: Child,
    what: String,
    grace: Duration,
}

impl ChildGuard {
    /// Guard `child` (killed at once on drop).
    pub fn new(child: Child) -> ChildGuard {
        let what = format!("child process {}", child.id());
        ChildGuard { child, what, grace: Duration::ZERO }
    }

    /// Its name in messages.
    pub fn named(mut self, what: impl Into<String>) -> ChildGuard {
        self.what = what.into();
        self
    }

    /// Stop it with SIGTERM and give it `grace` to exit before SIGKILL (as given: not scaled).
    pub fn grace(mut self, grace: Duration) -> ChildGuard {
        self.grace = grace;
        self
    }

    /// Its name in messages.
    pub fn what(&self) -> &str {
        &self.what
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its exit status, if it has exited (it is reaped then).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        self.try_wait().is_none()
    }

    /// Stop it and reap it: SIGTERM (and SIGCONT, should it be stopped), then SIGKILL if it has
    /// not exited within the grace; at once with no grace. Its exit status (also when it had
    /// exited already); `None` only if it could not be reaped.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        if let Some(s) = self.try_wait() {
            return Some(s);
        }
        if !self.grace.is_zero() {
            signal(self.pid(), libc::SIGTERM);
            signal(self.pid(), libc::SIGCONT);
            let start = Instant::now();
            while start.elapsed() < self.grace {
                if let Some(s) = self.try_wait() {
                    return Some(s);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            eprintln!("{} did not stop within {:?} of SIGTERM: killed", self.what, self.grace);
        }
        self.kill()
    }

    /// SIGKILL now and reap: its exit status (also when it had exited already).
    pub fn kill(&mut self) -> Option<ExitStatus> {
        if let Some(s) = self.try_wait() {
            return Some(s);
        }
        let _ = self.child.kill();
        self.child.wait().ok()
    }
}

impl Deref for ChildGuard {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.child
    }
}

impl DerefMut for ChildGuard {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.child
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The lines a child wrote to stderr, as they come.
#[derive(Default)]
struct Log {
    state: Mutex<LogState>,
    changed: Condvar,
}

#[derive(Default)]
struct LogState {
    lines: Vec<String>,
    /// Its stderr reached its end (the child exited, or closed it).
    ended: bool,
}

impl Log {
    fn lock(&self) -> MutexGuard<'_, LogState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Read `from` to its end, line by line (invalid UTF-8 replaced), copying each line to our
    /// stderr when `echo`.
    fn collect(&self, from: impl Read, echo: bool) {
        let mut from = BufReader::new(from);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match from.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let line = String::from_utf8_lossy(&buf).trim_end_matches(['\n', '\r']).to_string();
            if echo {
                eprintln!("{line}");
            }
            self.lock().lines.push(line);
            self.changed.notify_all();
        }
        self.lock().ended = true;
        self.changed.notify_all();
    }
}

/// A long-running `gpu-tracer` child (usually `gpu-tracer agent`): spawned from a prepared
/// [`Command`], its stderr collected line by line ([`AgentProcess::log`]; every failed wait
/// shows it), its readiness read from that log — the "serving http://ADDR/metrics" line
/// ([`AgentProcess::metrics_addr`]), the "serving the gRPC API on ADDR" line
/// ([`AgentProcess::grpc_addr`]), any line ([`AgentProcess::wait_log`]) — and stopped on drop:
/// SIGTERM, SIGKILL after [`STOP_GRACE`], reaped.
///
/// Waits end with an error, never hang: after the patience ([`DEFAULT_PATIENCE`], scaled), or
/// as soon as the child is gone.
pub struct AgentProcess {
    child: ChildGuard,
    log: Arc<Log>,
    /// Lines before this one were consumed by [`AgentProcess::wait_log`].
    cursor: usize,
    patience: Duration,
    /// (scheme, address) from the "serving …/metrics" line.
    metrics: Option<(String, String)>,
    grpc: Option<String>,
}

impl std::fmt::Debug for AgentProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentProcess").field("child", &self.child.what).field("metrics", &self.metrics).finish()
    }
}

/// The address in a "serving http(s)://ADDR/metrics" line: (scheme, ADDR).
fn metrics_line(line: &str) -> Option<(String, String)> {
    ["http", "https"].into_iter().find_map(|scheme| {
        let rest = line.split(&format!("serving {scheme}://")).nth(1)?;
        let url = rest.split_whitespace().next()?;
        Some((scheme.to_string(), url.strip_suffix("/metrics")?.to_string()))
    })
}

/// The address in a "serving the gRPC API on ADDR" line.
fn grpc_line(line: &str) -> Option<String> {
    let rest = line.split("serving the gRPC API on ").nth(1)?;
    rest.split_whitespace().next().map(str::to_string)
}

impl AgentProcess {
    /// Spawn `cmd` with its stderr piped and collected (stdin and stdout are as `cmd` sets them;
    /// pipe stdout for [`AgentProcess::wait_with_output`]). Does not wait for anything.
    pub fn spawn(cmd: &mut Command) -> Result<AgentProcess> {
        Self::spawn_with(cmd, false)
    }

    /// [`AgentProcess::spawn`], each log line also copied to this process's stderr as it comes
    /// (the simulator shows the agent's log).
    pub fn spawn_echoing(cmd: &mut Command) -> Result<AgentProcess> {
        Self::spawn_with(cmd, true)
    }

    /// [`AgentProcess::spawn`] and wait until it serves /metrics ([`AgentProcess::metrics_addr`]).
    pub fn start(cmd: &mut Command) -> Result<AgentProcess> {
        let mut agent = Self::spawn(cmd)?;
        agent.metrics_addr()?;
        Ok(agent)
    }

    fn spawn_with(cmd: &mut Command, echo: bool) -> Result<AgentProcess> {
        let program =
            Path::new(cmd.get_program()).file_name().unwrap_or(OsStr::new("?")).to_string_lossy().into_owned();
        let subcommand =
            cmd.get_args().map(|a| a.to_string_lossy().into_owned()).find(|a| SUBCOMMANDS.contains(&a.as_str()));
        let mut child = cmd
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| HarnessError::io(format!("spawn {}", cmd.get_program().to_string_lossy()), e))?;
        let what = match subcommand {
            Some(s) => format!("{program} {s} (pid {})", child.id()),
            None => format!("{program} (pid {})", child.id()),
        };
        let stderr = child.stderr.take().expect("stderr is piped");
        let log = Arc::new(Log::default());
        let sink = Arc::clone(&log);
        std::thread::Builder::new()
            .name("agent-log".into())
            .spawn(move || sink.collect(stderr, echo))
            .map_err(|e| HarnessError::io("start the log reader", e))?;
        Ok(AgentProcess {
            child: ChildGuard::new(child).named(what).grace(scaled(STOP_GRACE)),
            log,
            cursor: 0,
            patience: DEFAULT_PATIENCE,
            metrics: None,
            grpc: None,
        })
    }

    /// Wait this long (stretched by [`super::time_scale`]) instead of [`DEFAULT_PATIENCE`].
    pub fn patience(mut self, patience: Duration) -> AgentProcess {
        self.patience = patience;
        self
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// Its name in messages (`gpu-tracer agent (pid N)`).
    pub fn what(&self) -> &str {
        self.child.what()
    }

    /// Every line it has logged so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().lines.clone()
    }

    /// Its exit status, if it has exited (it is reaped then).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait()
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        self.child.running()
    }

    /// The address it serves /metrics on (`IP:PORT`), once it has said so ("serving
    /// http://IP:PORT/metrics", or https).
    pub fn metrics_addr(&mut self) -> Result<String> {
        if let Some((_, addr)) = &self.metrics {
            return Ok(addr.clone());
        }
        let (_, found) = self.wait_for("serving http(s)://…/metrics", scaled(self.patience), 0, metrics_line)?;
        self.metrics = Some(found.clone());
        Ok(found.1)
    }

    /// The address it serves /metrics on, if it has said so by now (does not wait).
    pub fn try_metrics_addr(&mut self) -> Option<String> {
        if self.metrics.is_none() {
            self.metrics = self.log.lock().lines.iter().find_map(|l| metrics_line(l));
        }
        self.metrics.as_ref().map(|(_, addr)| addr.clone())
    }

    /// The scheme of /metrics (`http` or `https`), once it serves.
    pub fn metrics_scheme(&mut self) -> Result<String> {
        self.metrics_addr()?;
        Ok(self.metrics.as_ref().map(|(s, _)| s.clone()).unwrap_or_default())
    }

    /// The address it serves the gRPC API on (`unix:///PATH`, `IP:PORT`), once it has said so
    /// ("serving the gRPC API on ADDR").
    pub fn grpc_addr(&mut self) -> Result<String> {
        if let Some(addr) = &self.grpc {
            return Ok(addr.clone());
        }
        let (_, addr) = self.wait_for("serving the gRPC API on …", scaled(self.patience), 0, grpc_line)?;
        self.grpc = Some(addr.clone());
        Ok(addr)
    }

    /// The next line containing `what`, after the one the previous `wait_log` returned (each line
    /// is returned once: waiting twice for "session started" waits for two sessions).
    pub fn wait_log(&mut self, what: &str) -> Result<String> {
        self.wait_log_within(what, self.patience)
    }

    /// [`AgentProcess::wait_log`], waiting at most `timeout` (stretched by
    /// [`super::time_scale`]).
    pub fn wait_log_within(&mut self, what: &str, timeout: Duration) -> Result<String> {
        let (at, line) = self.wait_for(&format!("{what:?}"), scaled(timeout), self.cursor, |l| {
            l.contains(what).then(|| l.to_string())
        })?;
        self.cursor = at + 1;
        Ok(line)
    }

    /// The first line from index `from` on for which `find` says something: (its index, that).
    /// Fails, with the log, after `timeout` or once the child is gone.
    fn wait_for<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        from: usize,
        mut find: impl FnMut(&str) -> Option<T>,
    ) -> Result<(usize, T)> {
        let start = Instant::now();
        let log = Arc::clone(&self.log);
        let mut next = from;
        // Set once the child has exited: its stderr may take a moment to reach its end.
        let mut exited: Option<(ExitStatus, Instant)> = None;
        loop {
            let (ended, len) = {
                let mut state = log.lock();
                for (i, line) in state.lines.iter().enumerate().skip(next) {
                    if let Some(v) = find(line) {
                        return Ok((i, v));
                    }
                }
                next = next.max(state.lines.len());
                if !state.ended {
                    state = log
                        .changed
                        .wait_timeout_while(state, Duration::from_millis(50), |s| s.lines.len() == next && !s.ended)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
                (state.ended, state.lines.len())
            };
            if len > next {
                continue;
            }
            if exited.is_none()
                && let Some(status) = self.child.try_wait()
            {
                exited = Some((status, Instant::now()));
            }
            match exited {
                Some((status, at)) if ended || at.elapsed() > Duration::from_secs(1) => {
                    return Err(self.failure(format!("it ended ({status}) before it logged {what}")));
                }
                // Its stderr ended but it has not exited yet: look again in a moment.
                _ if ended => std::thread::sleep(Duration::from_millis(20)),
                _ => {}
            }
            if start.elapsed() >= timeout {
                return Err(self.failure(format!("it did not log {what} within {timeout:?}")));
            }
        }
    }

    fn failure(&self, what: String) -> HarnessError {
        HarnessError::Agent { what: format!("{}: {what}", self.child.what()), log: self.log() }
    }

    /// Once it has exited: wait until all of its stderr is in the log (at most 5 s, scaled: a
    /// process it left behind may hold the pipe open).
    fn finish_log(&self) {
        let log = self.log.lock();
        let _ = self.log.changed.wait_timeout_while(log, scaled(Duration::from_secs(5)), |s| !s.ended);
    }

    /// Stop it (SIGTERM, SIGKILL after [`STOP_GRACE`]) and reap it: its exit status.
    pub fn stop(mut self) -> Result<ExitStatus> {
        let status = self.child.stop().ok_or_else(|| self.failure("it could not be reaped".into()))?;
        self.finish_log();
        Ok(status)
    }

    /// SIGKILL it and reap it: its exit status.
    pub fn kill(mut self) -> Result<ExitStatus> {
        self.child.kill().ok_or_else(|| self.failure("it could not be reaped".into()))
    }

    /// Wait until it exits by itself (a `--duration`, a session's end), without a bound, as
    /// [`Child::wait_with_output`]: its status, its stdout (when piped) and its stderr (the log,
    /// one line each).
    pub fn wait_with_output(mut self) -> Result<Output> {
        let mut stdout = Vec::new();
        if let Some(mut out) = self.child.stdout.take() {
            out.read_to_end(&mut stdout).map_err(|e| HarnessError::io("read its stdout", e))?;
        }
        let status = self.child.wait().map_err(|e| HarnessError::io(format!("wait for {}", self.what()), e))?;
        self.finish_log();
        let mut stderr = self.log().join("\n").into_bytes();
        if !stderr.is_empty() {
            stderr.push(b'\n');
        }
        Ok(Output { status, stdout, stderr })
    }

    /// Wait until it exits by itself, as [`AgentProcess::wait_with_output`]: its status.
    pub fn wait(self) -> Result<ExitStatus> {
        self.wait_with_output().map(|o| o.status)
    }
}

/// `gpu-tracer`'s commands, to name a child in messages.
const SUBCOMMANDS: [&str; 8] = ["agent", "profile", "events", "top", "cost", "doctor", "api", "sim"];

/// A failed wait's message: the last [`SHOWN_LINES`] lines of the log.
pub(crate) fn show_log(log: &[String]) -> String {
    let skip = log.len().saturating_sub(SHOWN_LINES);
    let mut s = if skip > 0 { format!("  ({skip} earlier lines)\n") } else { String::new() };
    for l in &log[skip..] {
        s.push_str("  ");
        s.push_str(l);
        s.push('\n');
    }
    if log.is_empty() {
        s.push_str("  (nothing)\n");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", script]).stdin(Stdio::null()).stdout(Stdio::null());
        c
    }

    #[test]
    fn lines_name_the_addresses() {
        assert_eq!(
            metrics_line("gpu-tracer agent: serving http://127.0.0.1:41233/metrics"),
            Some(("http".into(), "127.0.0.1:41233".into()))
        );
        assert_eq!(metrics_line("serving https://[::1]:9400/metrics"), Some(("https".into(), "[::1]:9400".into())));
        assert_eq!(metrics_line("INFO serving /metrics, /healthz, /readyz listen=127.0.0.1:1"), None);
        assert_eq!(
            grpc_line("gpu-tracer agent: serving the gRPC API on unix:///tmp/x/api.sock"),
            Some("unix:///tmp/x/api.sock".into())
        );
    }

    #[test]
    fn waits_read_the_log_and_end_when_the_child_does() {
        let mut p =
            AgentProcess::spawn(&mut sh("echo starting >&2; echo 'x: serving http://127.0.0.1:5/metrics' >&2; \
             echo 'x: serving the gRPC API on 127.0.0.1:6' >&2; echo 'session started 1' >&2; \
             echo 'session started 2' >&2; sleep 30"))
            .unwrap();
        assert_eq!(p.metrics_addr().unwrap(), "127.0.0.1:5");
        assert_eq!(p.metrics_scheme().unwrap(), "http");
        assert_eq!(p.grpc_addr().unwrap(), "127.0.0.1:6");
        assert_eq!(p.wait_log("session started").unwrap(), "session started 1");
        assert_eq!(p.wait_log("session started").unwrap(), "session started 2");
        let e = p.wait_log_within("session started", Duration::from_millis(200)).unwrap_err();
        assert_eq!(e.reason(), "agent");
        assert!(e.to_string().contains("session started 2"), "the log is shown: {e}");
        assert!(p.running());
        let status = p.stop().unwrap();
        assert!(!status.success(), "stopped by SIGTERM: {status}");

        // A child that ends: the wait fails at once, naming how it ended.
        let start = Instant::now();
        let mut p = AgentProcess::spawn(&mut sh("echo 'error: no such flag' >&2; exit 2")).unwrap();
        let e = p.metrics_addr().unwrap_err().to_string();
        assert!(start.elapsed() < Duration::from_secs(10), "{:?}", start.elapsed());
        assert!(e.contains("exit status: 2") && e.contains("error: no such flag"), "{e}");
    }

    #[test]
    fn output_holds_stdout_and_the_whole_log() {
        let mut c = sh("echo out; echo one >&2; echo two >&2");
        c.stdout(Stdio::piped());
        let out = AgentProcess::spawn(&mut c).unwrap().wait_with_output().unwrap();
        assert!(out.status.success());
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(String::from_utf8_lossy(&out.stderr), "one\ntwo\n");
    }

    #[test]
    fn a_guard_stops_what_ignores_sigterm_after_its_grace() {
        let child = sh("trap '' TERM; sleep 30").spawn().unwrap();
        let mut g = ChildGuard::new(child).named("stubborn").grace(Duration::from_millis(300));
        std::thread::sleep(Duration::from_millis(100));
        let start = Instant::now();
        let status = g.stop().unwrap();
        assert!(start.elapsed() >= Duration::from_millis(300));
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL));
        // Stopping again is its status.
        assert_eq!(g.stop(), Some(status));
        let pid = {
            let g = ChildGuard::new(sh("sleep 30").spawn().unwrap());
            g.pid()
        };
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "killed and reaped on drop");
    }
}
