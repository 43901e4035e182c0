//! `gpu-tracer`: per-container accounting of NVIDIA GPU usage, from eBPF probes on the driver.
use std::{
    io::Write,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use tracer_user::{
    config::{Config, Overrides},
    doctor,
    export::{
        events::{EventFormat, EventStream, EventWriter, to_proto},
        top,
    },
    model::EventContext,
    pipeline::Agent,
    runner::Handler as _,
    runner::{self, Flow, Schedule},
};

#[derive(Parser)]
#[command(
    name = "gpu-tracer",
    version,
    about = "Per-container accounting of NVIDIA GPU memory, from eBPF probes on the driver's ioctls.",
    long_about = "gpu-tracer watches the NVIDIA driver interface (/dev/nvidia*) with eBPF and attributes every \
GPU memory allocation to the process and cgroup (container) that made it. It needs root, or CAP_BPF + \
CAP_PERFMON (+ CAP_SYS_PTRACE to scan processes that started before it).\n\n\
Try:\n  gpu-tracer doctor            what works on this node, and why not\n  \
gpu-tracer top               each GPU's memory, SM share, energy and cost per container\n  \
gpu-tracer events --json     the raw event stream as JSON lines\n  \
gpu-tracer agent             the node agent: /metrics, /healthz, /readyz on --listen\n\n\
With --price-per-gpu-hour the cost of each GPU is split between its containers (the parts add up \
to the bill). NVML (libnvidia-ml.so.1) gives the device totals; Kubernetes (kubeconfig or in-cluster) \
names the pods, and the kubelet's pod-resources socket says which GPUs each was allocated.\n\n\
Without a GPU, `cargo xtask sim` runs a simulated node (a fake driver and three pod workloads)."
)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Clone)]
struct CommonArgs {
    /// TOML config file (flags override it; every key is listed in docs/configuration.md).
    #[arg(long, global = true, env = "GPU_TRACER_CONFIG")]
    config: Option<PathBuf>,
    // Flags that override the file's settings (config::Overrides: its doc comments are the help).
    #[command(flatten)]
    overrides: Overrides,
    /// Log level filter (also RUST_LOG) [default: warn].
    #[arg(long, global = true, default_value = "warn")]
    log: String,
}

#[derive(Subcommand)]
enum Command {
    /// Live table of GPU memory per cgroup (container), refreshed in place.
    Top(TopArgs),
    /// Stream every event (length-delimited protobuf `gputracer.v1.Event`, or JSON lines).
    Events(EventsArgs),
    /// Check what works on this node: kernel features, privileges, driver, probes.
    Doctor(DoctorArgs),
    /// Run as the node agent: trace, attribute, and serve /metrics, /healthz and /readyz.
    Agent(AgentArgs),
}

#[derive(Args)]
struct AgentArgs {
    /// Address to serve /metrics, /healthz and /readyz on.
    #[arg(long, default_value = "127.0.0.1:9400")]
    listen: std::net::SocketAddr,
    /// Stop after this many seconds (default: run until SIGINT/SIGTERM).
    #[arg(long)]
    duration: Option<f64>,
}

#[derive(Args)]
struct TopArgs {
    /// Print one snapshot after --interval and exit (for scripts).
    #[arg(long)]
    once: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Also list processes under each cgroup.
    #[arg(long)]
    per_process: bool,
    /// Refresh interval in milliseconds.
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    /// Stop after this many seconds (default: run until Ctrl-C).
    #[arg(long)]
    duration: Option<f64>,
}

#[derive(Args)]
struct EventsArgs {
    /// JSON lines instead of length-delimited protobuf.
    #[arg(long)]
    json: bool,
    /// Write to this file instead of stdout.
    #[arg(long, short)]
    output: Option<PathBuf>,
    /// Stop after this many seconds.
    #[arg(long)]
    duration: Option<f64>,
    /// Stop after this many events.
    #[arg(long)]
    count: Option<u64>,
    /// Print a summary (events, accounting identity) to stderr at the end.
    #[arg(long)]
    summary: bool,
    /// Per-event mode for this process: every kernel launch as its own event (grid, block, shared
    /// memory, stream, kernel name), on top of the counts. Repeatable.
    #[arg(long = "per-event-pid", value_name = "PID")]
    per_event_pids: Vec<u32>,
    /// Per-event mode for this cgroup (a path relative to the cgroup2 mount, as in
    /// /proc/PID/cgroup, or a numeric cgroup id). Repeatable.
    #[arg(long = "per-event-cgroup", value_name = "PATH|ID")]
    per_event_cgroups: Vec<String>,
}

#[derive(Args)]
struct DoctorArgs {
    /// JSON output.
    #[arg(long)]
    json: bool,
}

fn build_config(c: &CommonArgs) -> Result<Config> {
    let mut cfg = match &c.config {
        Some(p) => {
            let (cfg, warnings) = Config::from_file(p)?;
            for w in warnings {
                tracing::warn!("{w}");
            }
            cfg
        }
        None => Config::default(),
    };
    c.overrides.apply(&mut cfg);
    cfg.validate()?;
    Ok(cfg)
}

fn log_report(agent: &Agent) {
    let r = agent.report();
    tracing::info!(mode = %r.attach_mode, reason = %r.attach_reason, driver = %agent.driver_version.version_string(), "probes loaded");
    for (name, st) in [("driver", &r.driver), ("lifecycle", &r.lifecycle), ("cuda", &r.cuda)] {
        if let Some(error) = st.error() {
            tracing::warn!(family = name, %error, "probe family failed; the others keep running");
        }
    }
}

async fn run_top(cfg: Config, a: TopArgs) -> Result<()> {
    let mut agent = Agent::start(cfg).context("starting the tracer")?;
    agent.start_kubernetes().await.context("starting Kubernetes identity")?;
    log_report(&agent);
    let tty = !a.once && !a.json && std::io::IsTerminal::is_terminal(&std::io::stdout());
    // `top` stops at a tick (after printing), never between two: its duration is checked there.
    let schedule =
        Schedule { interval: Duration::from_millis(a.interval_ms.max(50)), tick_at_start: false, duration: None };
    let mut out =
        TopOut { duration: a.duration.and_then(Schedule::duration_from_secs), args: a, tty, start: Instant::now() };
    runner::run(&mut agent, schedule, &mut out).await?;
    Ok(())
}

/// The `top` command's output side: a snapshot printed (or redrawn) every tick.
struct TopOut {
    args: TopArgs,
    tty: bool,
    start: Instant,
    duration: Option<Duration>,
}

impl runner::Handler for TopOut {
    type Error = anyhow::Error;
    fn tick(&mut self, agent: &mut Agent) -> Result<Flow> {
        let a = &self.args;
        agent.drain(&mut |_, _| {});
        let snap = agent.snapshot();
        let out = if a.json {
            serde_json::to_string(&snap)? + "\n"
        } else {
            top::render(&snap, &top::RenderOptions { per_process: a.per_process, width: top::terminal_width() })
        };
        let mut stdout = std::io::stdout();
        if self.tty {
            // Redraw in place.
            write!(stdout, "\x1b[H\x1b[2J{out}")?;
        } else {
            write!(stdout, "{out}")?;
            if !a.once && !a.json {
                writeln!(stdout)?;
            }
        }
        stdout.flush()?;
        let done = a.once || self.duration.is_some_and(|d| self.start.elapsed() >= d);
        Ok(if done { Flow::Stop } else { Flow::Continue })
    }
}

async fn run_events(cfg: Config, a: EventsArgs) -> Result<()> {
    let fmt = if a.json { EventFormat::JsonLines } else { EventFormat::Protobuf };
    let writer = EventWriter::to_path(a.output.as_deref(), fmt).with_context(|| {
        format!("opening {}", a.output.as_ref().map(|p| p.display().to_string()).unwrap_or("stdout".into()))
    })?;
    let mut agent = Agent::start(cfg).context("starting the tracer")?;
    agent.start_kubernetes().await.context("starting Kubernetes identity")?;
    log_report(&agent);
    if !a.per_event_pids.is_empty() || !a.per_event_cgroups.is_empty() {
        let mut ids = Vec::new();
        for c in &a.per_event_cgroups {
            ids.push(agent.cgroup_id(c).with_context(|| format!("--per-event-cgroup {c}: no such cgroup"))?);
        }
        agent.set_per_event(&ids, &a.per_event_pids).context("switching on per-event mode")?;
    }
    // Events for processes found by the start-up scan were applied before the stream existed; the
    // stream starts with what happens from now on.
    let mut out = EventOut { stream: EventStream::new(writer, a.count), last_batch: Instant::now() };
    let schedule = Schedule {
        // Launch batches once a second; NVML is sampled (and the guardrails checked) on the
        // snapshot interval.
        interval: Duration::from_secs(1),
        tick_at_start: false,
        duration: a.duration.and_then(Schedule::duration_from_secs),
    };
    runner::run(&mut agent, schedule, &mut out).await?;
    // What is left: the ring buffer's last records, the last launch counts and violations.
    agent.drain(&mut |ev, id| out.event(ev, id));
    out.batches(&mut agent, false);
    let out = out.stream;
    // A broken pipe (`gpu-tracer events | head -1`) is a normal end.
    let written = out.finish().context("writing events")?;
    if a.summary {
        let (_, acc) = agent.accounting();
        eprintln!(
            "events written: {written}; kernel seen {} = received {} + dropped {} (in flight {}); decode errors {:?}",
            acc.seen, acc.received, acc.dropped, acc.in_flight, agent.stats.decode_errors
        );
    }
    Ok(())
}

/// The `events` command's output side: every event as it is applied, launch batches and new
/// violations every tick; it stops the loop when the stream is done (`--count`, a write error).
struct EventOut {
    stream: EventStream<Box<dyn Write + Send>>,
    last_batch: Instant,
}

impl EventOut {
    /// Launch counts since the last batch and the violations raised since, as events; with
    /// `snapshot`, NVML is sampled (and the guardrails checked) first when the snapshot interval
    /// says so.
    fn batches(&mut self, agent: &mut Agent, snapshot: bool) {
        emit_launch_batches(&mut self.stream, agent, self.last_batch.elapsed());
        if snapshot {
            let _ = agent.snapshot();
        }
        emit_violations(&mut self.stream, agent);
        self.last_batch = Instant::now();
    }
}

impl runner::Handler for EventOut {
    type Error = anyhow::Error;
    fn event(&mut self, ev: &tracer_user::decode::Event, ctx: &EventContext) {
        self.stream.emit_with(|| to_proto(ev, ctx));
    }
    fn tick(&mut self, agent: &mut Agent) -> Result<Flow> {
        self.batches(agent, true);
        Ok(Flow::Continue)
    }
    fn should_stop(&self) -> bool {
        self.stream.is_done()
    }
}

/// Launches counted in the kernel since the last batch, one event per process and entry point.
fn emit_launch_batches(out: &mut EventStream<impl Write>, agent: &mut Agent, interval: Duration) {
    for (k, n) in agent.launch_batches() {
        out.emit_with(|| {
            let (now, e) = agent.context_now(k.tgid, k.cgroup_id);
            let interval_ns = interval.as_nanos() as u64;
            tracer_user::export::events::launch_batch_to_proto(k.tgid, k.cgroup_id, k.entry, n, interval_ns, now, &e)
        });
    }
}

/// Guardrail violations raised since the last call, one event each.
fn emit_violations(out: &mut EventStream<impl Write>, agent: &mut Agent) {
    for v in agent.take_new_violations() {
        out.emit_with(|| {
            let cgroup_id = agent.cgroup_of_container(&v.namespace, &v.pod, &v.container).unwrap_or(0);
            let (now, e) = agent.context_now(v.pid, cgroup_id);
            tracer_user::export::events::violation_to_proto(&v, cgroup_id, now, &e)
        });
    }
}

async fn run_doctor(cfg: Config, a: DoctorArgs) -> Result<()> {
    let report = doctor::run(&cfg).await;
    if a.json {
        println!("{}", report.to_json()?);
    } else {
        print!("{}", report.render_text());
    }
    if report.failed() {
        std::process::exit(1);
    }
    Ok(())
}

/// The node agent: the pipeline, with /metrics, /healthz and /readyz served on `--listen`.
async fn run_agent(cfg: Config, a: AgentArgs) -> Result<()> {
    use std::sync::Arc;
    use tracer_user::export::{
        http::{HealthSettings, ServeState, serve},
        metrics::MetricsRegistry,
    };

    /// Heartbeat every step; a snapshot published every tick.
    struct Publish(Arc<ServeState>);
    impl runner::Handler for Publish {
        type Error = anyhow::Error;
        fn stepped(&mut self, _: &mut Agent) {
            self.0.heartbeat();
        }
        fn tick(&mut self, agent: &mut Agent) -> Result<Flow> {
            agent.drain(&mut |_, _| {});
            self.0.publish(Arc::new(agent.snapshot()));
            Ok(Flow::Continue)
        }
    }

    let interval = Duration::from_millis(cfg.snapshot_interval_ms.max(100));
    let mut agent = Agent::start(cfg).context("starting the tracer")?;
    agent.start_kubernetes().await.context("starting Kubernetes identity")?;
    log_report(&agent);
    let state = Arc::new(ServeState::new(MetricsRegistry::new(), HealthSettings::default()));
    state.mark_attached(agent.report().attach_mode.as_str());
    let server = serve(a.listen, state.clone()).await.context("starting the metrics server")?;
    tracing::info!(listen = %server.local_addr, "serving /metrics, /healthz, /readyz");
    eprintln!("gpu-tracer agent: serving http://{}/metrics", server.local_addr);
    let schedule =
        Schedule { interval, tick_at_start: true, duration: a.duration.and_then(Schedule::duration_from_secs) };
    runner::run(&mut agent, schedule, &mut Publish(state)).await?;
    server.shutdown().await.context("stopping the metrics server")?;
    Ok(())
}

fn main() {
    // An expected error (a bad flag value, a missing device, probes that cannot attach) is a
    // message naming the cause and the fix, never a backtrace, whatever RUST_BACKTRACE says:
    // anyhow's `Debug` would print one, so the chain is printed here instead.
    if let Err(e) = run() {
        eprintln!("error: {e}");
        for cause in e.chain().skip(1) {
            eprintln!("  caused by: {cause}");
        }
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let cli = Cli::parse();
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| cli.common.log.clone());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .init();
    let cfg = build_config(&cli.common)?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    match cli.command {
        Command::Top(a) => rt.block_on(run_top(cfg, a)),
        Command::Events(a) => rt.block_on(run_events(cfg, a)),
        Command::Doctor(a) => rt.block_on(run_doctor(cfg, a)),
        Command::Agent(a) => rt.block_on(run_agent(cfg, a)),
    }
}
