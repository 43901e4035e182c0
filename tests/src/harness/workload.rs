//! [`Workload`]: an `nv-workload` child, placed in a cgroup before it runs, driven line by line.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::Duration;

use super::{HarnessError, PodCgroup, Result, locate_binary};
use crate::workload::parse_number;

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// One answer line of the workload, split into `key=value` fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// Whether it started with `ok`.
    pub ok: bool,
    /// The whole line.
    pub line: String,
    fields: BTreeMap<String, String>,
}

impl Answer {
    /// Parse an answer line.
    pub fn parse(line: &str) -> Self {
        let line = line.trim_end().to_string();
        let ok = line == "ok" || line.starts_with("ok ");
        let fields = line
            .split_whitespace()
            .skip(1)
            .filter_map(|w| w.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Answer { ok, line, fields }
    }

    /// The value of field `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields.get(key).map(String::as_str)
    }

    /// Field `key` as a number (decimal, or hex with `0x`).
    pub fn number(&self, key: &str) -> Result<u64> {
        self.get(key)
            .and_then(parse_number)
            .ok_or_else(|| HarnessError::Protocol(format!("no numeric {key}= in {:?}", self.line)))
    }

    /// Field `key` as a signed number (e.g. `ret=-1`).
    pub fn signed(&self, key: &str) -> Result<i64> {
        self.get(key)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| HarnessError::Protocol(format!("no signed {key}= in {:?}", self.line)))
    }

    /// Field `key` as a 32-bit handle.
    pub fn handle(&self, key: &str) -> Result<u32> {
        let v = self.number(key)?;
        u32::try_from(v).map_err(|_| HarnessError::Protocol(format!("{key}={v:#x} is not a handle")))
    }
}

/// Settings for [`Workload`].
#[derive(Debug, Clone)]
pub struct WorkloadBuilder {
    dev_dir: PathBuf,
    binary: Option<PathBuf>,
    cgroup: Option<PathBuf>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    timeout: Duration,
}

impl WorkloadBuilder {
    /// Set an environment variable in the workload (e.g. `FAKE_LIBCUDA_KERNEL_NS` for the fake
    /// libcuda's simulated GPU time).
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Path of the `nv-workload` binary (default: [`locate_binary`]).
    pub fn binary(mut self, p: impl Into<PathBuf>) -> Self {
        self.binary = Some(p.into());
        self
    }

    /// Start the workload inside `cg` (it is moved there before `exec`).
    pub fn cgroup(mut self, cg: &PodCgroup) -> Self {
        self.cgroup = Some(cg.path().to_path_buf());
        self
    }

    /// Start the workload inside the cgroup directory `dir`.
    pub fn cgroup_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cgroup = Some(dir.into());
        self
    }

    /// Use the struct layouts of driver `version` (`--driver-version`).
    pub fn driver_version(mut self, version: &str) -> Self {
        self.args.extend(["--driver-version".into(), version.into()]);
        self
    }

    /// `dlopen` this `libcuda.so.1` at start-up for the `cuda-*` commands (`--libcuda`).
    pub fn libcuda(mut self, path: impl AsRef<Path>) -> Self {
        self.args.extend(["--libcuda".into(), path.as_ref().display().to_string()]);
        self
    }

    /// How long to wait for each answer (default 30 s; stretched by `time_scale`).
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }

    /// Spawn it, waiting on stdin for commands.
    pub fn spawn(self) -> Result<Workload> {
        let binary = match self.binary {
            Some(b) => b,
            None => locate_binary("nv-workload")?,
        };
        let mut cmd = Command::new(&binary);
        cmd.arg("--dev-dir").arg(&self.dev_dir).args(&self.args).envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        if let Some(dir) = &self.cgroup {
            let procs = CString::new(dir.join("cgroup.procs").into_os_string().into_encoded_bytes())
                .map_err(|_| HarnessError::Protocol("cgroup path contains NUL".into()))?;
            // SAFETY: the hook runs in the forked child before exec and only makes
            // async-signal-safe calls (open/write/close) on a path prepared before the fork.
            unsafe {
                cmd.pre_exec(move || {
                    // Writing "0" moves the writing process itself.
                    let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    let r = libc::write(fd, b"0".as_ptr().cast(), 1);
                    let err = std::io::Error::last_os_error();
                    libc::close(fd);
                    if r != 1 { Err(err) } else { Ok(()) }
                });
            }
        }
        let mut child = cmd.spawn().map_err(|e| HarnessError::io(format!("spawn {}", binary.display()), e))?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Workload { pid: child.id(), child, stdin: Some(stdin), answers: rx, timeout: self.timeout })
    }
}

/// A running `nv-workload`. Killed (SIGKILL) and reaped on drop.
#[derive(Debug)]
pub struct Workload {
    child: Child,
    pid: u32,
    stdin: Option<ChildStdin>,
    answers: Receiver<String>,
    timeout: Duration,
}

impl Workload {
    /// Settings for a workload using the device files in `dev_dir`.
    pub fn builder(dev_dir: &Path) -> WorkloadBuilder {
        WorkloadBuilder {
            dev_dir: dev_dir.into(),
            binary: None,
            cgroup: None,
            args: Vec::new(),
            env: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Spawn a workload on `dev_dir`, inside `cgroup` if given.
    pub fn spawn(dev_dir: &Path, cgroup: Option<&PodCgroup>) -> Result<Self> {
        let mut b = Self::builder(dev_dir);
        if let Some(cg) = cgroup {
            b = b.cgroup(cg);
        }
        b.spawn()
    }

    /// The workload's pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Send one command line and return the answer line (`ok ...` or `err ...`).
    pub fn cmd(&mut self, line: &str) -> Result<String> {
        let stdin = self.stdin.as_mut().ok_or_else(|| HarnessError::Protocol("workload stdin closed".into()))?;
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .map_err(|e| HarnessError::io(format!("send {line:?} to nv-workload"), e))?;
        // Stretched on slow hosts (a guest under TCG forks 3000 children in well over 30 s).
        let wait = super::scaled(self.timeout);
        match self.answers.recv_timeout(wait) {
            Ok(answer) => Ok(answer),
            Err(RecvTimeoutError::Timeout) => {
                Err(HarnessError::Timeout { what: format!("nv-workload answer to {line:?}"), after: wait })
            }
            Err(RecvTimeoutError::Disconnected) => match self.child.try_wait() {
                Ok(Some(status)) => {
                    Err(HarnessError::Exited { what: format!("nv-workload (during {line:?})"), status })
                }
                _ => Err(HarnessError::Protocol(format!("nv-workload closed stdout during {line:?}"))),
            },
        }
    }

    /// Send a command and parse the answer, whatever it is.
    pub fn answer(&mut self, line: &str) -> Result<Answer> {
        self.cmd(line).map(|a| Answer::parse(&a))
    }

    /// Send a command that must succeed; an `err` answer is an error.
    pub fn ok(&mut self, line: &str) -> Result<Answer> {
        let a = self.answer(line)?;
        if a.ok { Ok(a) } else { Err(HarnessError::Protocol(format!("{line:?} answered {:?}", a.line))) }
    }

    /// Close stdin (the workload exits at EOF) and wait for it to end.
    pub fn finish(mut self) -> Result<std::process::ExitStatus> {
        self.stdin.take();
        self.child.wait().map_err(|e| HarnessError::io("wait for nv-workload", e))
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Wait for the process to end on its own (e.g. after `exit`).
    pub fn wait(&mut self) -> Result<std::process::ExitStatus> {
        self.child.wait().map_err(|e| HarnessError::io("wait for nv-workload", e))
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
