//! One standalone profiling session: load the probes here (as `top` does), switch per-event mode
//! on for the workload with a deadline the kernel checks, record until the duration, a signal,
//! the workload's exit or a limit, switch it off, and write the trace and the summary.
use std::{
    io::{IsTerminal, Write},
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use super::{Limits, Recorder, Target, perfetto, summary};
use crate::{
    clock,
    config::Config,
    export::events::to_proto,
    pipeline::Agent,
    runner::{self, Flow, Schedule, Stopped},
};

pub use super::target::TargetSpec;

/// How progress is shown while recording.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Nothing (stderr is not a terminal and no `--json`).
    Off,
    /// A redrawn line on the terminal.
    Bar,
    /// One JSON object per second on stderr.
    Json,
}

impl Progress {
    /// `Bar` on a terminal, `Json` when asked, else `Off`.
    pub fn choose(json: bool) -> Progress {
        if json {
            Progress::Json
        } else if std::io::stderr().is_terminal() {
            Progress::Bar
        } else {
            Progress::Off
        }
    }
}

/// What a session is asked to do.
#[derive(Clone, Debug)]
pub struct Options {
    pub target: TargetSpec,
    pub duration: Duration,
    pub output: PathBuf,
    pub summary_json: Option<PathBuf>,
    /// Also write the HTML report here.
    pub html: Option<PathBuf>,
    /// Gaps between launches at least this long are idle.
    pub idle_gap: Duration,
    pub limits: Limits,
    pub max_trace_bytes: u64,
    pub progress: Progress,
}

/// How long per-event mode stays on past the session's end if nothing switches it off (the
/// profiler killed): the kernel programs stop sending launches one by one then.
pub const DEADLINE_GRACE: Duration = Duration::from_secs(5);

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
pub const LOCK_DIR: &str = "/run/gpu-tracer/profile";

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

/// The progress shown while recording (a bar on a terminal, JSON lines with `--json`).
pub struct Shown {
    progress: Progress,
    bar: Option<indicatif::ProgressBar>,
    started: Instant,
    duration: Duration,
    max_trace_bytes: u64,
}

/// Bytes a kept event takes in the trace, about (for the progress line's estimate).
const TRACE_BYTES_PER_EVENT: u64 = 120;

impl Shown {
    /// Progress for a session of `opts`, starting now.
    pub fn new(opts: &Options) -> Shown {
        let bar = (opts.progress == Progress::Bar).then(|| {
            let b = indicatif::ProgressBar::new(opts.duration.as_millis() as u64);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} recording [{bar:30}] {elapsed}/{duration_precise} {msg}",
                )
                .expect("a valid template")
                .progress_chars("=> "),
            );
            b
        });
        Shown {
            progress: opts.progress,
            bar,
            started: Instant::now(),
            duration: opts.duration,
            max_trace_bytes: opts.max_trace_bytes,
        }
    }

    /// Show where `rec` stands; `dropped`: the tracer's drops so far, when known.
    pub fn show(&self, rec: &super::Recording, dropped: Option<u64>) {
        let elapsed = self.started.elapsed().as_secs_f64();
        let kept = rec.events_seen - rec.events_over_limit;
        let trace = kept * TRACE_BYTES_PER_EVENT;
        match self.progress {
            Progress::Off => {}
            Progress::Json => {
                let line = serde_json::json!({
                    "elapsed_s": (elapsed * 10.0).round() / 10.0,
                    "duration_s": self.duration.as_secs_f64(),
                    "launches": rec.launches.len(),
                    "memory_calls": rec.memory.len(),
                    "calls": rec.calls.len(),
                    "events_over_limit": rec.events_over_limit,
                    "tracer_dropped": dropped,
                    "trace_bytes_estimate": trace,
                });
                let _ = writeln!(std::io::stderr(), "{line}");
            }
            Progress::Bar => {
                if let Some(b) = &self.bar {
                    b.set_position((elapsed * 1000.0) as u64);
                    b.set_message(format!(
                        "{} launches, {} memory calls, {} other calls, {} dropped, trace ~{}",
                        rec.launches.len(),
                        rec.memory.len(),
                        rec.calls.len(),
                        dropped.unwrap_or(0) + rec.events_over_limit,
                        indicatif::HumanBytes(trace.min(self.max_trace_bytes))
                    ));
                }
            }
        }
    }

    /// Clear the bar.
    pub fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}

/// The recording loop's handler: every event to the recorder, a progress line every tick.
struct Session {
    recorder: Recorder,
    shown: Shown,
    stop: Option<&'static str>,
    /// When NVML was last sampled for the session (once a second).
    nvml_at: Instant,
}

/// How often a standalone session samples NVML.
const NVML_EVERY: Duration = Duration::from_secs(1);

impl Session {
    /// Sample NVML now and record the pass.
    fn sample_nvml(&mut self, agent: &mut Agent) {
        agent.sample_now();
        self.nvml_at = Instant::now();
        if let Some(s) = agent.nvml_sample() {
            self.recorder.nvml(&super::gpus::gpu_samples(&s));
        }
    }
}

impl runner::Handler for Session {
    type Error = anyhow::Error;
    fn event(&mut self, ev: &crate::decode::Event, ctx: &crate::model::EventContext) {
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
        self.shown.show(self.recorder.recording(), Some(agent.accounting().1.dropped));
        if self.recorder.target_exited() {
            self.stop = Some("workload exited");
        } else if self.recorder.limit_reached() {
            self.stop = Some("event limit");
        }
        Ok(if self.stop.is_some() { Flow::Stop } else { Flow::Continue })
    }
}

/// What a finished session wrote.
pub struct Outcome {
    pub summary: summary::Summary,
}

/// The trace file, created before anything is loaded or asked: a path that cannot be written
/// fails first.
pub fn create_output(opts: &Options) -> Result<std::fs::File> {
    std::fs::File::create(&opts.output).with_context(|| format!("creating the trace file {}", opts.output.display()))
}

/// Write what `rec` holds: the trace into `file`, the summary and the HTML report where asked.
pub fn write_outputs(rec: &super::Recording, target: &Target, opts: &Options, file: std::fs::File) -> Result<Outcome> {
    let idle_ns = opts.idle_gap.as_nanos().min(u64::MAX as u128) as u64;
    let stats = perfetto::write(rec, idle_ns, opts.max_trace_bytes, std::io::BufWriter::new(file))
        .with_context(|| format!("writing the trace to {}", opts.output.display()))?;
    let summary = summary::summarize(rec, target, idle_ns, stats);
    if let Some(p) = &opts.summary_json {
        let text = serde_json::to_string_pretty(&summary)? + "\n";
        std::fs::write(p, text).with_context(|| format!("writing the summary to {}", p.display()))?;
    }
    if let Some(p) = &opts.html {
        std::fs::write(p, super::html::render(rec, &summary))
            .with_context(|| format!("writing the HTML report to {}", p.display()))?;
    }
    Ok(Outcome { summary })
}

/// Run a standalone session with `cfg` (already [`prepare`]d).
pub async fn run(cfg: Config, opts: Options) -> Result<Outcome> {
    // A PID's lock is known before anything loads: a second session is refused at once.
    let early_lock = match &opts.target {
        TargetSpec::Pid(p) => Some(SessionLock::take(std::path::Path::new(LOCK_DIR), &[format!("pid-{p}")])?),
        _ => None,
    };
    let file = create_output(&opts)?;
    let mut agent = Agent::start(cfg).context("starting the tracer")?;
    if let Some(e) = agent.report().cuda.error() {
        bail!("the cuda probes did not attach, so there is nothing to record: {e}");
    }
    agent.start_kubernetes().await.context("starting Kubernetes identity")?;
    let resolved = super::target::resolve(&mut agent, &opts.target)?;
    let _locks = match early_lock {
        Some(l) => l,
        None => SessionLock::take(std::path::Path::new(LOCK_DIR), &resolved.locks)?,
    };
    // Launches counted before the window are not the window's.
    let _ = agent.launch_batches();
    let dropped_before = agent.accounting().1.dropped;
    let start = clock::monotonic_ns();
    agent
        .set_per_event_for(&resolved.cgroups, &resolved.tgids, opts.duration + DEADLINE_GRACE)
        .context("switching on per-event mode for the workload")?;
    tracing::info!(target = %resolved.description, duration_s = opts.duration.as_secs_f64(), "recording");
    let target = resolved.target.clone();
    let mut session = Session {
        recorder: Recorder::new(target.clone(), opts.limits, start),
        shown: Shown::new(&opts),
        stop: None,
        nvml_at: Instant::now(),
    };
    session.sample_nvml(&mut agent);
    let schedule =
        Schedule { interval: Duration::from_millis(250), tick_at_start: false, duration: Some(opts.duration) };
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
    session.shown.finish();
    let reason = match stopped {
        Stopped::Signal => "signal",
        Stopped::Duration => "duration",
        Stopped::Handler => session.stop.unwrap_or("handler"),
    };
    let dropped = agent.accounting().1.dropped.saturating_sub(dropped_before);
    let mut rec = session.recorder.finish(end, reason, dropped);
    rec.source = "standalone (this command's own probes)".into();
    rec.workload = resolved.description;
    write_outputs(&rec, &target, &opts, file)
}
