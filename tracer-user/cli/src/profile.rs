//! `gpu-tracer profile`: one workload's launches, allocations and calls over a window, written as
//! a Perfetto trace, a summary and an HTML report; recorded by this node's own probes
//! (`tracer_agent::profile::session`) or by a running agent (`--connect`).
use std::{io::Write, path::PathBuf, time::Duration};

use anyhow::Result;
use clap::Args;
use tracer_client::api::ConnectArgs;
use tracer_core::config::{Config, parse_seconds};

#[derive(Args)]
#[command(
    group(clap::ArgGroup::new("workload").required(true).args(["pid", "cgroup", "pod"])),
    after_help = "\
Per-event mode is switched on for the workload only, with a deadline the kernel programs check
(the window plus 5 s), so it ends even if this command is killed; every other process stays in
count mode. Open the trace in https://ui.perfetto.dev (nothing is uploaded: the UI runs locally).

Standalone (the default), profile loads its own probes, as `top` does. With --connect it asks a
running agent instead (its DaemonSet probes are reused, nothing more is attached): the agent
switches per-event mode on and off and streams the workload's events; synchronisation, copy and
memset calls are in the trace only where the agent's config has cuda_timed_calls: true.

What the trace holds: a process track per process (named after its pod when known), a thread
track per thread with each launch (kernel name, grid, block, shared memory, stream) and each
cuMemAlloc/cuMemFree, a track per CUDA stream, counters of the memory allocated in the window by
the CUDA and the driver ledgers, idle gaps where nothing was submitted, and flows from each
allocation to its free. Uprobes see when work is submitted, not when it runs on the GPU.

Examples:
  gpu-tracer profile --pid 4242 --duration 30 -o run.pftrace
  gpu-tracer profile --pod ml/trainer-0 --container trainer --connect unix:///run/gpu-tracer/api.sock
  gpu-tracer profile --cgroup kubepods.slice/kubepods-pod1234.slice/cri-containerd-ab12.scope \\
      --duration 10 -o run.pftrace --summary summary.json --html report.html"
)]
pub(crate) struct ProfileArgs {
    /// The workload: one process (host PID), with all its threads.
    #[arg(long, value_name = "PID")]
    pub(crate) pid: Option<u32>,
    /// The workload: every process of a cgroup (a container): a path relative to the cgroup2 mount,
    /// as in /proc/PID/cgroup, or a numeric cgroup id.
    #[arg(long, value_name = "PATH|ID")]
    pub(crate) cgroup: Option<String>,
    /// The workload: a pod's containers (Kubernetes identity must know the pod).
    #[arg(long, value_name = "NS/NAME")]
    pub(crate) pod: Option<String>,
    /// With --pod: only this container.
    #[arg(long, value_name = "NAME", requires = "pod")]
    pub(crate) container: Option<String>,
    #[command(flatten)]
    pub(crate) connect: ConnectArgs,
    /// How long to record, in seconds (at most 3600); Ctrl-C ends it early and still writes.
    #[arg(long, default_value = "30", value_parser = parse_seconds)]
    pub(crate) duration: f64,
    /// The Perfetto trace to write.
    #[arg(long, short, default_value = "profile.pftrace")]
    pub(crate) output: PathBuf,
    /// Also write the summary as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub(crate) summary: Option<PathBuf>,
    /// Also write an HTML report (one self-contained file: plots of memory, launches/s, top
    /// kernels and synchronisation time, with their tables; opens offline).
    #[arg(long, value_name = "FILE")]
    pub(crate) html: Option<PathBuf>,
    /// Progress as JSON lines on stderr and the summary as JSON on stdout (for scripts).
    #[arg(long)]
    pub(crate) json: bool,
    /// Keep at most this many events (launches, allocations, frees); later ones are counted and
    /// the summary says so.
    #[arg(long, default_value_t = tracer_core::profile::Limits::default().max_events)]
    pub(crate) max_events: u64,
    /// Largest trace to write, in MB (the Perfetto UI holds about 2 GB, and a trace grows 2-4x
    /// when loaded); what did not fit is counted in the summary.
    #[arg(long, value_name = "MB", default_value_t = 200)]
    pub(crate) max_trace_mb: u64,
    /// Gaps between a process's launches at least this long count as idle (milliseconds).
    #[arg(long, value_name = "MS", default_value_t = 10.0)]
    pub(crate) idle_gap_ms: f64,
}

/// The longest `profile --duration`.
const PROFILE_MAX_SECONDS: f64 = 3600.0;

pub(crate) async fn run_profile(mut cfg: Config, a: ProfileArgs) -> Result<()> {
    use tracer_agent::profile::session;
    use tracer_client::profile::{
        output::{self, Options, Progress},
        summary,
    };
    use tracer_core::profile::{Limits, TargetSpec};
    if !(a.duration > 0.0 && a.duration <= PROFILE_MAX_SECONDS) {
        anyhow::bail!("--duration {}: give 0 < seconds <= {PROFILE_MAX_SECONDS}", a.duration);
    }
    if !(a.idle_gap_ms.is_finite() && a.idle_gap_ms > 0.0) {
        anyhow::bail!("--idle-gap-ms {}: give a positive number of milliseconds", a.idle_gap_ms);
    }
    let target = match (a.pid, &a.cgroup, &a.pod) {
        (Some(p), _, _) => TargetSpec::Pid(p),
        (None, Some(c), _) => TargetSpec::Cgroup(c.clone()),
        (None, None, Some(p)) => TargetSpec::pod(p, a.container.as_deref()).map_err(anyhow::Error::msg)?,
        (None, None, None) => unreachable!("clap requires --pid, --cgroup or --pod"),
    };
    let conn = a.connect.settings()?;
    if conn.is_none() {
        session::prepare(&mut cfg, &target)?;
    }
    let opts = Options {
        target,
        duration: Duration::from_secs_f64(a.duration),
        output: a.output.clone(),
        summary_json: a.summary.clone(),
        html: a.html.clone(),
        idle_gap: Duration::from_secs_f64(a.idle_gap_ms / 1e3),
        limits: Limits { max_events: a.max_events },
        max_trace_bytes: a.max_trace_mb.saturating_mul(1_000_000),
        progress: Progress::choose(a.json),
    };
    let out = match &conn {
        Some(c) => tracer_client::profile::remote::run(c, opts).await?,
        None => {
            let early = session::early_locks(&opts.target)?;
            let file = output::create_output(&opts)?;
            let mut shown = output::Shown::new(&opts);
            let recorded =
                session::record(cfg, &opts.target, opts.duration, opts.limits, early, &mut |rec, dropped| {
                    shown.show(rec, dropped)
                })
                .await;
            shown.finish();
            let recorded = recorded?;
            output::write_outputs(&recorded.recording, &recorded.target, &opts, file)?
        }
    };
    let mut stdout = std::io::stdout();
    if a.json {
        writeln!(stdout, "{}", serde_json::to_string(&out.summary)?)?;
    } else {
        // Kernel and process names come from the workload.
        write!(stdout, "{}", tracer_core::format::printable(&summary::render(&out.summary)))?;
        writeln!(stdout, "trace: {} (open it in https://ui.perfetto.dev)", a.output.display())?;
    }
    Ok(())
}
