//! One standalone profiling session: load the probes here (as `top` does), switch per-event mode
//! on for the workload with a deadline the kernel checks, record until the duration, a signal,
//! the workload's exit or a limit, switch it off, and write the trace and the summary.
use std::{
    io::Write,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::{
    pipeline::Agent,
    runner::{self, Flow, Schedule, Stopped},
};
use tracer_core::profile::{Limits, Recorder, Recording, Target, TargetSpec};
use tracer_core::{clock, config::Config, wire::events::to_proto};

/// How long per-event mode stays on past the session's end if nothing switches it off (the
/// profiler killed): the kernel programs stop sending launches one by one then.
pub(crate) const DEADLINE_GRACE: Duration = Duration::from_secs(5);

/// Before loading anything: the target exists and uses libcuda; the libcuda copies it maps are
/// added to the libraries probed (through `/proc/PID/root`, so a container's own copy works).
pub fn prepare(cfg: &mut Config, target: &TargetSpec) -> Result<()> {
    if !cfg.families.cuda {
        bail!("profile records libcuda's calls: the cuda probe family is off (--no-cuda or families.cuda = false)");
    }
    // Synchronisation, events, copies and memsets: probed for this session's own probes only.
    cfg.cuda_timed_calls = true;
    // And the NVIDIA ioctls' durations (their spans), where driver-entry mode would leave them out.
    cfg.ioctl_durations = true;
    if let TargetSpec::Pid(pid) = target {
        let dir = cfg.proc_root.join(pid.to_string());
        if !dir.exists() {
            bail!(
                "no process {pid} under {}: it exited, or the PID is from another PID namespace (give the \
                 host's PID, as `ps` on the node shows it)",
                cfg.proc_root.display()
            );
        }
        let libs = crate::proc::mapped_libcuda(&cfg.proc_root, *pid);
        if libs.is_empty() {
            let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
            bail!(
                "process {pid} ({}) has no libcuda.so mapped: nothing to profile (is it a CUDA program, and past \
                 its CUDA initialisation?)",
                comm.trim()
            );
        }
        for l in libs {
            if !cfg.cuda_libraries.contains(&l) {
                cfg.cuda_libraries.push(l);
            }
        }
    }
    Ok(())
}

/// Where the session locks live: one file per workload, held (`flock`) while a session records it.
pub(crate) const LOCK_DIR: &str = "/run/gpu-tracer/profile";

/// The lock of one workload's session: taken before anything is loaded, released when dropped
/// (and by the kernel when the process dies, SIGKILL included: nothing stale is left to clean).
pub struct SessionLock {
    _file: std::fs::File,
}

impl SessionLock {
    /// Take the locks named `names` (`pid-N`, `cgroup-ID`: [`Resolved::locks`]) in `dir`, or say
    /// who holds one.
    pub fn take(dir: &std::path::Path, names: &[String]) -> Result<Vec<SessionLock>> {
        names.iter().map(|n| SessionLock::take_one(dir, n)).collect()
    }

    fn take_one(dir: &std::path::Path, name: &str) -> Result<SessionLock> {
        use std::os::unix::{fs::OpenOptionsExt, io::AsRawFd};
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating the session lock directory {}", dir.display()))?;
        let path = dir.join(format!("{name}.lock"));
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("opening the session lock {}", path.display()))?;
        // SAFETY: flock on a file descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let holder = std::fs::read_to_string(&path).unwrap_or_default();
            bail!(
                "another profile session is recording this workload (held by {}; lock {}): one session per \
                 workload, wait for it to end",
                holder.trim(),
                path.display()
            );
        }
        use std::io::Seek;
        file.set_len(0)?;
        file.rewind()?;
        writeln!(file, "gpu-tracer pid {}", std::process::id())?;
        Ok(SessionLock { _file: file })
    }
}

/// Called every tick with what is recorded so far and the tracer's drops so far (progress).
pub(crate) type OnProgress<'a> = dyn FnMut(&Recording, Option<u64>) + 'a;

/// The recording loop's handler: every event to the recorder, the progress every tick.
struct Session<'a> {
    recorder: Recorder,
    progress: &'a mut OnProgress<'a>,
    stop: Option<&'static str>,
    /// When NVML was last sampled for the session (once a second).
    nvml_at: Instant,
}

/// How often a standalone session samples NVML.
const NVML_EVERY: Duration = Duration::from_secs(1);

impl Session<'_> {
    /// Sample NVML now and record the pass.
    fn sample_nvml(&mut self, agent: &mut Agent) {
        agent.sample_now();
        self.nvml_at = Instant::now();
        if let Some(s) = agent.nvml_sample() {
            self.recorder.nvml(&tracer_core::profile::gpus::gpu_samples(&s));
        }
    }
}

impl runner::Handler for Session<'_> {
    type Error = anyhow::Error;
    fn event(&mut self, ev: &tracer_core::decode::Event, ctx: &tracer_core::model::EventContext) {
        // Only the workload's events are converted: the node's others are dropped before that.
        let h = ev.header();
        if self.recorder.target().selects(h.tgid, h.cgroup_id) {
            self.recorder.event(&to_proto(ev, ctx));
        }
    }
    fn tick(&mut self, agent: &mut Agent) -> Result<Flow> {
        for (key, n) in agent.launch_batches() {
            self.recorder.counted(key.tgid, key.cgroup_id, n);
        }
        if self.nvml_at.elapsed() >= NVML_EVERY {
            self.sample_nvml(agent);
        }
        (self.progress)(self.recorder.recording(), Some(agent.accounting().1.dropped));
        if self.recorder.target_exited() {
            self.stop = Some("workload exited");
        } else if self.recorder.limit_reached() {
            self.stop = Some("event limit");
        }
        Ok(if self.stop.is_some() { Flow::Stop } else { Flow::Continue })
    }
}

/// What a standalone session recorded, and the workload it selected.
pub struct Recorded {
    pub recording: Recording,
    pub target: Target,
}

/// The locks a session can take before anything is loaded: a PID's (a second session on it is
/// refused at once). Take them before creating the outputs.
pub fn early_locks(spec: &TargetSpec) -> Result<Option<Vec<SessionLock>>> {
    match spec {
        TargetSpec::Pid(p) => Ok(Some(SessionLock::take(std::path::Path::new(LOCK_DIR), &[format!("pid-{p}")])?)),
        _ => Ok(None),
    }
}

/// Record a standalone session on `spec` for `duration` with `cfg` (already [`prepare`]d): this
/// process's own probes, per-event mode switched on for the workload with a deadline the kernel
/// checks, until the duration, a signal, the workload's exit or `limits`. `early` is what
/// [`early_locks`] took; `progress` is called every tick.
pub async fn record(
    cfg: Config,
    spec: &TargetSpec,
    duration: Duration,
    limits: Limits,
    early: Option<Vec<SessionLock>>,
    progress: &mut OnProgress<'_>,
) -> Result<Recorded> {
    let mut agent = Agent::start(cfg).context("starting the tracer")?;
    if let Some(e) = agent.report().cuda.error() {
        bail!("the cuda probes did not attach, so there is nothing to record: {e}");
    }
    agent.start_kubernetes().await.context("starting Kubernetes identity")?;
    let resolved = super::target::resolve(&mut agent, spec)?;
    let _locks = match early {
        Some(l) => l,
        None => SessionLock::take(std::path::Path::new(LOCK_DIR), &resolved.locks)?,
    };
    // Launches counted before the window are not the window's.
    let _ = agent.launch_batches();
    let dropped_before = agent.accounting().1.dropped;
    let start = clock::monotonic_ns();
    agent
        .set_per_event_for(&resolved.cgroups, &resolved.tgids, duration + DEADLINE_GRACE)
        .context("switching on per-event mode for the workload")?;
    tracing::info!(target = %resolved.description, duration_s = duration.as_secs_f64(), "recording");
    let target = resolved.target.clone();
    let mut session = Session {
        recorder: Recorder::new(target.clone(), limits, start),
        progress,
        stop: None,
        nvml_at: Instant::now(),
    };
    session.sample_nvml(&mut agent);
    let schedule = Schedule { interval: Duration::from_millis(250), tick_at_start: false, duration: Some(duration) };
    let stopped = runner::run(&mut agent, schedule, &mut session).await;
    // Off first, whatever happened; then what is left in the ring buffer.
    let off = agent.set_per_event(&[], &[]);
    let stopped = stopped?;
    off.context("switching per-event mode off")?;
    session.sample_nvml(&mut agent);
    let end = clock::monotonic_ns();
    agent.drain(&mut |ev, ctx| runner::Handler::event(&mut session, ev, ctx));
    for (key, n) in agent.launch_batches() {
        session.recorder.counted(key.tgid, key.cgroup_id, n);
    }
    let reason = match stopped {
        Stopped::Signal => "signal",
        Stopped::Duration => "duration",
        Stopped::Handler => session.stop.unwrap_or("handler"),
    };
    let dropped = agent.accounting().1.dropped.saturating_sub(dropped_before);
    let mut rec = session.recorder.finish(end, reason, dropped);
    rec.source = "standalone (this command's own probes)".into();
    rec.workload = resolved.description;
    Ok(Recorded { recording: rec, target })
}
