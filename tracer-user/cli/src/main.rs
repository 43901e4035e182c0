//! `gpu-tracer`: per-container accounting of NVIDIA GPU usage, from eBPF probes on the driver.
use std::{
    io::Write,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use gpu_tracer_proto::v1;
use tracer_agent::{
    doctor,
    export::api::hub::EventHub,
    pipeline::Agent,
    runner::{self, Flow, Handler as _, Schedule},
};
use tracer_client::{
    api::{self as api_client, ConnectArgs, ConnectSettings, FilterArgs},
    events::{EventFormat, EventStream, EventWriter},
    top,
};
use tracer_core::{
    config::{Config, Overrides, api::DEFAULT_LISTEN, parse_seconds},
    cost,
    model::EventContext,
    wire::{
        events::{kind_of, to_proto},
        filter::Filters,
        snapshot::snapshot_from_proto,
    },
};

/// A line for people on stderr. A stderr that cannot be written (full, closed) is no reason to stop
/// or to panic, as `eprintln!` would: the line is dropped.
macro_rules! note {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

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
    Events(Box<EventsArgs>),
    /// Check what works on this node: kernel features, privileges, driver, probes.
    Doctor(DoctorArgs),
    /// Run as the node agent: trace, attribute, and serve /metrics, /healthz, /readyz and the gRPC API.
    Agent(AgentArgs),
    /// Call a running agent's gRPC API (no probes loaded here).
    Api(ApiArgs),
    /// The bill split per namespace, pod label, pod or node: from a running agent (since it
    /// started), over a period for a whole fleet from the Prometheus that scrapes the agents, or
    /// over a recorded events file.
    Cost(Box<CostArgs>),
    /// Record one workload's GPU activity for a while (every kernel launch, allocation and free)
    /// into a Perfetto trace and a summary, without restarting it.
    Profile(Box<ProfileArgs>),
}

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
struct ProfileArgs {
    /// The workload: one process (host PID), with all its threads.
    #[arg(long, value_name = "PID")]
    pid: Option<u32>,
    /// The workload: every process of a cgroup (a container): a path relative to the cgroup2 mount,
    /// as in /proc/PID/cgroup, or a numeric cgroup id.
    #[arg(long, value_name = "PATH|ID")]
    cgroup: Option<String>,
    /// The workload: a pod's containers (Kubernetes identity must know the pod).
    #[arg(long, value_name = "NS/NAME")]
    pod: Option<String>,
    /// With --pod: only this container.
    #[arg(long, value_name = "NAME", requires = "pod")]
    container: Option<String>,
    #[command(flatten)]
    connect: ConnectArgs,
    /// How long to record, in seconds (at most 3600); Ctrl-C ends it early and still writes.
    #[arg(long, default_value = "30", value_parser = parse_seconds)]
    duration: f64,
    /// The Perfetto trace to write.
    #[arg(long, short, default_value = "profile.pftrace")]
    output: PathBuf,
    /// Also write the summary as JSON to this file.
    #[arg(long, value_name = "FILE")]
    summary: Option<PathBuf>,
    /// Also write an HTML report (one self-contained file: plots of memory, launches/s, top
    /// kernels and synchronisation time, with their tables; opens offline).
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// Progress as JSON lines on stderr and the summary as JSON on stdout (for scripts).
    #[arg(long)]
    json: bool,
    /// Keep at most this many events (launches, allocations, frees); later ones are counted and
    /// the summary says so.
    #[arg(long, default_value_t = tracer_core::profile::Limits::default().max_events)]
    max_events: u64,
    /// Largest trace to write, in MB (the Perfetto UI holds about 2 GB, and a trace grows 2-4x
    /// when loaded); what did not fit is counted in the summary.
    #[arg(long, value_name = "MB", default_value_t = 200)]
    max_trace_mb: u64,
    /// Gaps between a process's launches at least this long count as idle (milliseconds).
    #[arg(long, value_name = "MS", default_value_t = 10.0)]
    idle_gap_ms: f64,
}

#[derive(Args)]
#[command(after_help = "\
Sources (one):
  --connect ADDR        a running agent's API: its bill since it started [default: unix:///run/gpu-tracer/api.sock]
  --metrics URL         an agent's /metrics (e.g. through kubectl port-forward): the same bill
  --prometheus URL      the Prometheus (Thanos, Mimir) that scrapes the agents: the fleet over --range
  --events FILE         a recording of `gpu-tracer events -o FILE`: the bill over the recording

The rows add up to the total to the cent (largest-remainder rounding of exact integer amounts); idle,
driver-reserved, unattributed and evicted cost are rows of their own, or spread over each node's
containers with --policy spread.

Examples:
  gpu-tracer cost
  gpu-tracer cost --by label:team --policy spread
  gpu-tracer cost --prometheus http://prometheus:9090 --range 30d --by namespace --format csv > bill.csv
  gpu-tracer cost --prometheus http://prometheus:9090 --range 7d --by node,namespace --matchers 'cluster=\"eu-1\"'
  gpu-tracer events -o week.pb --duration 604800 && gpu-tracer cost --events week.pb --by pod")]
struct CostArgs {
    /// Group by these, in order (comma-separated or repeated): namespace, pod, container, node,
    /// or label:KEY for a pod label the agents export (kubernetes.label_allow_list) [default: namespace].
    #[arg(long, value_delimiter = ',', value_name = "DIM")]
    by: Vec<cost::GroupBy>,
    /// Idle, driver-reserved, unattributed and evicted cost: rows of their own (`lines`), or spread
    /// over each node's containers in proportion to their cost (`spread`).
    #[arg(long, value_enum, default_value_t = cost::Policy::Lines)]
    policy: cost::Policy,
    /// table (for people), csv (spreadsheets) or json (scripts; exact nano-currency amounts too).
    #[arg(long, value_enum, default_value_t = CostFormat::Table)]
    format: CostFormat,
    /// The Prometheus server that scrapes the agents (its base URL): the fleet's bill over --range.
    #[arg(long, value_name = "URL", conflicts_with_all = ["metrics", "connect"])]
    prometheus: Option<String>,
    /// With --prometheus: the period's length, e.g. 30d, 12h, 90m, 3600s.
    #[arg(long, value_name = "DURATION", default_value = "30d", value_parser = parse_period)]
    range: f64,
    /// With --prometheus: the period's end, in seconds since the epoch [default: now].
    #[arg(long, value_name = "UNIX_SECONDS", requires = "prometheus")]
    end: Option<f64>,
    /// With --prometheus: label matchers added to every query, e.g. 'cluster="eu-1",job="gpu-tracer"'.
    #[arg(long, value_name = "MATCHERS", default_value = "", requires = "prometheus")]
    matchers: String,
    /// With --prometheus: a file holding a bearer token for it.
    #[arg(long, value_name = "FILE", requires = "prometheus")]
    prometheus_token_file: Option<PathBuf>,
    /// With an https:// --prometheus: trust this CA certificate (PEM) [default: the system's roots].
    #[arg(long, value_name = "PEM", requires = "prometheus")]
    prometheus_ca: Option<PathBuf>,
    /// An agent's /metrics URL: the bill since that agent started.
    #[arg(long, value_name = "URL", conflicts_with = "connect")]
    metrics: Option<String>,
    /// A file recorded by `gpu-tracer events -o FILE` (protobuf; `-` for stdin): the bill over the
    /// recording, from the Bill events the agent writes once a minute.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["prometheus", "metrics", "connect"])]
    events: Option<String>,
    /// With --metrics: a file holding the bearer token /metrics asks for (metrics.token_file).
    #[arg(long, value_name = "FILE", requires = "metrics")]
    metrics_token_file: Option<PathBuf>,
    /// The node's name in the report, for --metrics and --connect [default: the node the agent
    /// watches pods for, else the URL's host or this host's name].
    #[arg(long, value_name = "NAME")]
    node: Option<String>,
    /// [default --connect: unix:///run/gpu-tracer/api.sock]
    #[command(flatten)]
    connect: ConnectArgs,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum CostFormat {
    Table,
    Csv,
    Json,
}

/// `30d`, `12h`, `90m`, `3600s` or `3600` as seconds.
fn parse_period(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let (num, unit) = match t.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => t.split_at(i),
        None => (t, "s"),
    };
    let mult = match unit {
        "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        "d" => 86_400.0,
        "w" => 604_800.0,
        _ => return Err(format!("`{s}`: the unit must be s, m, h, d or w (e.g. 30d)")),
    };
    let v: f64 = num.trim().parse().map_err(|_| format!("`{s}` is not a duration (e.g. 30d, 12h, 90m)"))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("`{s}`: the period must be longer than zero"));
    }
    Ok(v * mult)
}

#[derive(Args)]
struct ApiArgs {
    #[command(subcommand)]
    call: ApiCall,
}

#[derive(Subcommand)]
enum ApiCall {
    /// The latest interval's snapshot: as `top` prints it, or the `gputracer.v1.Snapshot` message as
    /// JSON (field names of snapshot.proto, enums as numbers).
    GetSnapshot {
        #[arg(long)]
        json: bool,
        /// Also list processes under each cgroup (table only).
        #[arg(long)]
        per_process: bool,
        /// [default --connect: unix:///run/gpu-tracer/api.sock]
        #[command(flatten)]
        connect: ConnectArgs,
    },
    /// Where the agent stands (probe families, NVML, Kubernetes, counters): the
    /// `gputracer.v1.AgentStatus` message as JSON.
    GetStatus {
        /// [default --connect: unix:///run/gpu-tracer/api.sock]
        #[command(flatten)]
        connect: ConnectArgs,
    },
}

#[derive(Args)]
struct AgentArgs {
    /// Address to serve /metrics, /healthz and /readyz on.
    #[arg(long, default_value = "127.0.0.1:9400")]
    listen: std::net::SocketAddr,
    /// Stop after this many seconds (default: run until SIGINT/SIGTERM).
    #[arg(long, value_parser = parse_seconds)]
    duration: Option<f64>,
    /// Where to serve the gRPC API: unix:///PATH (mode 0660), tcp://IP:PORT (TLS: api.tls_cert and
    /// api.tls_key in the config), or `off` [default: api.listen, unix:///run/gpu-tracer/api.sock].
    #[arg(long, value_name = "ADDR")]
    grpc_listen: Option<String>,
}

#[derive(Args)]
struct TopArgs {
    /// Print one snapshot and exit (for scripts): the first after --interval-ms whose attribution
    /// interval is complete (with NVML on, the shares, energy and bill are then real numbers, not
    /// zeros; waits at most 15 s).
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
    #[arg(long, value_parser = parse_seconds)]
    duration: Option<f64>,
    #[command(flatten)]
    connect: ConnectArgs,
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
    #[arg(long, value_parser = parse_seconds)]
    duration: Option<f64>,
    /// Stop after this many events.
    #[arg(long)]
    count: Option<u64>,
    /// Print a summary (events, accounting identity) to stderr at the end.
    #[arg(long)]
    summary: bool,
    /// Per-event mode for this process: every kernel launch as its own event (grid, block, shared
    /// memory, stream, kernel name), and every synchronisation, copy and memset timed
    /// (`cuda_call`), on top of the counts. Repeatable.
    #[arg(long = "per-event-pid", value_name = "PID")]
    per_event_pids: Vec<u32>,
    /// Per-event mode for this cgroup (a path relative to the cgroup2 mount, as in
    /// /proc/PID/cgroup, or a numeric cgroup id). Repeatable.
    #[arg(long = "per-event-cgroup", value_name = "PATH|ID")]
    per_event_cgroups: Vec<String>,
    #[command(flatten)]
    filter: FilterArgs,
    #[command(flatten)]
    connect: ConnectArgs,
    /// With --connect: first replay the agent's recent events from the last this many seconds.
    #[arg(long, value_name = "SECONDS", requires = "connect", value_parser = parse_seconds)]
    since: Option<f64>,
    /// With --connect: first replay the newest N matching events the agent still holds.
    #[arg(long, value_name = "N", requires = "connect", conflicts_with = "first")]
    last: Option<u64>,
    /// With --connect: first replay the oldest N matching events the agent still holds.
    #[arg(long, value_name = "N", requires = "connect")]
    first: Option<u64>,
    /// With --connect: stop after the replay instead of following new events.
    #[arg(long, requires = "connect")]
    no_follow: bool,
}

#[derive(Args)]
struct DoctorArgs {
    /// JSON output.
    #[arg(long)]
    json: bool,
}

/// What a command does with the configuration, so which checks it must pass before it runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ConfigUse {
    /// Loads probes here (`agent`, `top`, `events`): the values and the host paths must be right.
    Local,
    /// Reads a running agent (`--connect`, `api`): only the values are checked.
    Remote,
    /// `doctor`: reports what is wrong (the `config` check) instead of refusing to look.
    Report,
}

impl ConfigUse {
    fn of(command: &Command) -> Self {
        match command {
            Command::Top(a) if a.connect.connect.is_some() => ConfigUse::Remote,
            Command::Events(a) if a.connect.connect.is_some() => ConfigUse::Remote,
            Command::Api(_) | Command::Cost(_) => ConfigUse::Remote,
            Command::Doctor(_) => ConfigUse::Report,
            Command::Top(_) | Command::Events(_) | Command::Agent(_) | Command::Profile(_) => ConfigUse::Local,
        }
    }
}

fn build_config(c: &CommonArgs, how: ConfigUse) -> Result<Config> {
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
    match how {
        ConfigUse::Local => {
            cfg.validate()?;
            cfg.check_host_paths()?;
        }
        ConfigUse::Remote => cfg.validate()?,
        ConfigUse::Report => {}
    }
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
    if let Some(conn) = a.connect.settings()? {
        return run_top_remote(conn, a).await;
    }
    let mut agent = Agent::start(cfg).context("starting the tracer")?;
    agent.start_kubernetes().await.context("starting Kubernetes identity")?;
    log_report(&agent);
    // `top` stops at a tick (after printing), never between two: its duration is checked there.
    let schedule =
        Schedule { interval: Duration::from_millis(a.interval_ms.max(50)), tick_at_start: false, duration: None };
    runner::run(&mut agent, schedule, &mut TopOut::new(a)).await?;
    Ok(())
}

/// `top --connect`: the same tables from a running agent's snapshots (no probes loaded here).
async fn run_top_remote(conn: ConnectSettings, a: TopArgs) -> Result<()> {
    if a.json {
        anyhow::bail!(
            "--json with --connect: use `gpu-tracer api get-snapshot --json --connect {}` (the API's message as JSON)",
            conn.addr
        );
    }
    let mut client = api_client::connect(&conn).await?;
    let mut out = TopOut::new(a);
    let mut tick = tokio::time::interval(Duration::from_millis(out.args.interval_ms.max(50)));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
            _ = term.recv() => return Ok(()),
        }
        let response = client
            .get_snapshot(v1::GetSnapshotRequest {})
            .await
            .with_context(|| format!("GetSnapshot from the agent at {}", conn.addr))?;
        let proto = response.into_inner().snapshot.context("the agent's GetSnapshot response has no snapshot")?;
        let snap = snapshot_from_proto(proto).context("reading the agent's snapshot")?;
        if out.print(&snap)? == Flow::Stop {
            return Ok(());
        }
    }
}

/// How long `top --once` waits for the first complete attribution interval.
const ONCE_WAIT: Duration = Duration::from_secs(15);

/// The `top` command's output side: a snapshot printed (or redrawn) every tick.
struct TopOut {
    args: TopArgs,
    tty: bool,
    start: Instant,
    duration: Option<Duration>,
}

impl TopOut {
    fn new(args: TopArgs) -> Self {
        let tty = !args.once && !args.json && std::io::IsTerminal::is_terminal(&std::io::stdout());
        TopOut { duration: args.duration.and_then(Schedule::duration_from_secs), args, tty, start: Instant::now() }
    }

    /// Prints one frame; `Stop` once `--once` or `--duration` says so. `--once` prints the first
    /// snapshot with a complete attribution interval (NVML on: the first needs two samples), not
    /// one whose shares and bill are still zeros; after [`ONCE_WAIT`] it prints what there is and
    /// says so.
    fn print(&mut self, snap: &tracer_core::model::AgentSnapshot) -> Result<Flow> {
        let a = &self.args;
        if a.once && snap.first_interval_pending() {
            if self.start.elapsed() < ONCE_WAIT {
                return Ok(Flow::Continue);
            }
            note!(
                "warning: no attribution interval completed within {} s (NVML sampled too rarely?); \
                 printing the snapshot without shares, energy or cost",
                ONCE_WAIT.as_secs()
            );
        }
        let out = if a.json {
            serde_json::to_string(snap)? + "\n"
        } else {
            top::render(snap, &top::RenderOptions { per_process: a.per_process, width: top::terminal_width() })
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

impl runner::Handler for TopOut {
    type Error = anyhow::Error;
    fn tick(&mut self, agent: &mut Agent) -> Result<Flow> {
        agent.drain(&mut |_, _| {});
        let snap = agent.snapshot();
        self.print(&snap)
    }
}

async fn run_events(cfg: Config, a: EventsArgs) -> Result<()> {
    let fmt = if a.json { EventFormat::JsonLines } else { EventFormat::Protobuf };
    let (include, exclude) = a.filter.filters();
    let filters = Filters::new(&include, &exclude).context("the event filter flags")?;
    let conn = a.connect.settings()?;
    if conn.is_some() && (!a.per_event_pids.is_empty() || !a.per_event_cgroups.is_empty()) {
        anyhow::bail!(
            "--per-event-pid/--per-event-cgroup switch this process's own probes; with --connect there are none"
        );
    }
    let writer = EventWriter::to_path(a.output.as_deref(), fmt).with_context(|| {
        format!("opening {}", a.output.as_ref().map(|p| p.display().to_string()).unwrap_or("stdout".into()))
    })?;
    let stream = EventStream::new(writer, a.count);
    if let Some(conn) = conn {
        let request = v1::SubscribeRequest {
            follow: !a.no_follow,
            since_unix_ns: a.since.map_or(0, |s| {
                tracer_core::clock::wall_now_unix_ns().saturating_sub((s.max(0.0) * 1e9).min(u64::MAX as f64) as u64)
            }),
            number: a.last.or(a.first).unwrap_or(0),
            first: a.first.is_some(),
            include,
            exclude,
        };
        return run_events_remote(conn, request, stream, &a).await;
    }
    let bills = tracer_agent::export::bill_writer_for_this_process(cfg.kubernetes.node_name.as_deref());
    let mut cfg = cfg;
    // Each NVIDIA ioctl event carries its duration here (the node agent leaves them untimed by
    // default: `ioctl_durations`).
    cfg.ioctl_durations = true;
    if !a.per_event_pids.is_empty() || !a.per_event_cgroups.is_empty() {
        // Per-event mode also times synchronisation, copies and memsets: probe them.
        cfg.cuda_timed_calls = true;
    }
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
    let mut out = EventOut { stream, filters, last_batch: Instant::now(), bills };
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
    // The bill at the end of the recording (`cost --events` counts up to the last one).
    let snap = agent.snapshot();
    if let Some(ev) = out.bills.event(&snap, tracer_core::clock::wall_now_unix_ns()) {
        Emit::emit(&mut out, ev);
    }
    let out = out.stream;
    // A broken pipe (`gpu-tracer events | head -1`) is a normal end.
    let written = out.finish().context("writing events")?;
    if a.summary {
        let (_, acc) = agent.accounting();
        note!(
            "events written: {written}; kernel seen {} = received {} + dropped {} (in flight {}); decode errors {:?}",
            acc.seen,
            acc.received,
            acc.dropped,
            acc.in_flight,
            agent.stats.decode_errors
        );
    }
    Ok(())
}

/// The longest `profile --duration`.
const PROFILE_MAX_SECONDS: f64 = 3600.0;

async fn run_profile(mut cfg: Config, a: ProfileArgs) -> Result<()> {
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
        write!(stdout, "{}", summary::render(&out.summary))?;
        writeln!(stdout, "trace: {} (open it in https://ui.perfetto.dev)", a.output.display())?;
    }
    Ok(())
}

/// `events --connect`: the agent's event stream (filtered by the agent), written as a standalone
/// `events` writes it; events the agent could not hand over in time are counted and said. In
/// protobuf the agent's bytes are written as received (never decoded and encoded again).
async fn run_events_remote(
    conn: ConnectSettings,
    request: v1::SubscribeRequest,
    mut out: EventStream<Box<dyn Write + Send>>,
    a: &EventsArgs,
) -> Result<()> {
    use api_client::Received;
    let mut stream = api_client::subscribe_raw(&conn, request)
        .await
        .with_context(|| format!("subscribing to the agent's events at {}", conn.addr))?;
    let deadline = a.duration.and_then(Schedule::duration_from_secs).map(|d| tokio::time::Instant::now() + d);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut lost = 0u64;
    while !out.is_done() {
        let until = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        let message = tokio::select! {
            m = stream.message() => m.with_context(|| format!("the agent's event stream at {}", conn.addr))?,
            _ = until => break,
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
        };
        match message {
            Some(Received::Event(ev)) => {
                out.emit_encoded(&ev);
            }
            Some(Received::Lost(l)) => {
                lost += l.count;
                tracing::warn!(count = l.count, reason = %l.reason, "the agent dropped events for this subscriber (it read too slowly)");
            }
            None => break,
        }
    }
    let written = out.finish().context("writing events")?;
    if lost > 0 {
        note!("warning: {lost} events lost: this reader fell behind the agent (write to a faster sink, or filter)");
    }
    if a.summary {
        note!("events written: {written}; lost (reader behind): {lost}");
    }
    Ok(())
}

/// The `events` command's output side: every event as it is applied, launch batches and new
/// violations every tick; it stops the loop when the stream is done (`--count`, a write error).
struct EventOut {
    stream: EventStream<Box<dyn Write + Send>>,
    filters: Filters,
    last_batch: Instant,
    /// The node's bill, once a minute.
    bills: cost::bill::BillWriter,
}

impl EventOut {
    /// Launch counts since the last batch and the violations raised since, as events; with
    /// `snapshot`, NVML is sampled (and the guardrails checked) first when the snapshot interval
    /// says so.
    fn batches(&mut self, agent: &mut Agent, snapshot: bool) {
        let interval = self.last_batch.elapsed();
        emit_launch_batches(self, agent, interval);
        if snapshot {
            let snap = agent.snapshot();
            if let Some(ev) = self.bills.due(&snap, tracer_core::clock::wall_now_unix_ns()) {
                Emit::emit(self, ev);
            }
        }
        emit_violations(self, agent);
        self.last_batch = Instant::now();
    }
}

impl Emit for EventOut {
    fn wants(&self) -> bool {
        !self.stream.is_done()
    }
    fn emit(&mut self, ev: v1::Event) {
        if self.filters.matches(&ev) {
            self.stream.emit(&ev);
        }
    }
}

impl runner::Handler for EventOut {
    type Error = anyhow::Error;
    fn event(&mut self, ev: &tracer_core::decode::Event, ctx: &EventContext) {
        if Emit::wants(self) {
            Emit::emit(self, to_proto(ev, ctx));
        }
    }
    fn tick(&mut self, agent: &mut Agent) -> Result<Flow> {
        self.batches(agent, true);
        Ok(Flow::Continue)
    }
    fn should_stop(&self) -> bool {
        self.stream.is_done()
    }
}

/// Where the launch batches and violations of a tick go: the `events` stream, or the agent's hub and
/// OTLP (`run_agent`'s `Tee`).
trait Emit {
    /// Does it take events now? (When not, the message is not built.)
    fn wants(&self) -> bool;
    fn emit(&mut self, ev: v1::Event);
}

/// Launches counted in the kernel since the last batch, one event per process and entry point.
fn emit_launch_batches(out: &mut impl Emit, agent: &mut Agent, interval: Duration) {
    for (k, n) in agent.launch_batches() {
        if out.wants() {
            let (now, e) = agent.context_now(k.tgid, k.cgroup_id);
            let interval_ns = interval.as_nanos() as u64;
            out.emit(tracer_core::wire::events::launch_batch_to_proto(
                k.tgid,
                k.cgroup_id,
                k.entry,
                n,
                interval_ns,
                now,
                &e,
            ));
        }
    }
}

/// Guardrail violations raised since the last call, one event each.
fn emit_violations(out: &mut impl Emit, agent: &mut Agent) {
    for v in agent.take_new_violations() {
        if out.wants() {
            let cgroup_id = agent.cgroup_of_container(&v.namespace, &v.pod, &v.container).unwrap_or(0);
            let (now, e) = agent.context_now(v.pid, cgroup_id);
            out.emit(tracer_core::wire::events::violation_to_proto(&v, cgroup_id, now, &e));
        }
    }
}

/// `gpu-tracer api …`: one call to a running agent.
async fn run_api(a: ApiArgs) -> Result<()> {
    let (ApiCall::GetSnapshot { connect, .. } | ApiCall::GetStatus { connect }) = &a.call;
    let mut connect = connect.clone();
    connect.connect.get_or_insert_with(|| DEFAULT_LISTEN.to_string());
    let conn = connect.settings()?.context("an API address")?;
    let mut client = api_client::connect(&conn).await?;
    let mut stdout = std::io::stdout();
    match a.call {
        ApiCall::GetSnapshot { json, per_process, .. } => {
            let r = client.get_snapshot(v1::GetSnapshotRequest {}).await.context("GetSnapshot")?;
            let proto = r.into_inner().snapshot.context("the agent's GetSnapshot response has no snapshot")?;
            if json {
                writeln!(stdout, "{}", serde_json::to_string_pretty(&proto)?)?;
            } else {
                let snap = snapshot_from_proto(proto).context("reading the agent's snapshot")?;
                let o = top::RenderOptions { per_process, width: top::terminal_width() };
                write!(stdout, "{}", top::render(&snap, &o))?;
            }
        }
        ApiCall::GetStatus { .. } => {
            let r = client.get_status(v1::GetStatusRequest {}).await.context("GetStatus")?;
            writeln!(stdout, "{}", serde_json::to_string_pretty(&r.into_inner().status)?)?;
        }
    }
    stdout.flush()?;
    Ok(())
}

/// How long `cost --connect` waits for a fresh agent's first complete attribution interval.
const COST_WAIT: Duration = Duration::from_secs(15);

async fn run_cost(a: CostArgs) -> Result<()> {
    let read = |p: &PathBuf| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
    let input = if let Some(url) = &a.prometheus {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs_f64();
        let token = match &a.prometheus_token_file {
            Some(p) => Some(String::from_utf8(read(p)?).context("the token file is not text")?.trim().to_owned()),
            None => None,
        };
        let source = tracer_client::cost::prometheus::PrometheusSource {
            url: url.clone(),
            token,
            ca_pem: a.prometheus_ca.as_ref().map(read).transpose()?,
            matchers: a.matchers.clone(),
            end_unix_s: a.end.unwrap_or(now),
            range_s: a.range,
            pod_labels: a.by.iter().any(|b| matches!(b, cost::GroupBy::Label(_))),
            timeout: Duration::from_secs(120),
        };
        tracer_client::cost::prometheus::fetch(&source).await?
    } else if let Some(path) = &a.events {
        tracer_client::cost::events::from_file(path)?
    } else if let Some(url) = &a.metrics {
        let node = a.node.clone().unwrap_or_else(|| {
            url.parse::<hyper::Uri>().ok().and_then(|u| u.host().map(str::to_owned)).unwrap_or_else(|| url.clone())
        });
        let token = match &a.metrics_token_file {
            Some(p) => Some(String::from_utf8(read(p)?).context("the token file is not text")?.trim().to_owned()),
            None => None,
        };
        let text = tracer_client::cost::prometheus::get_text(url, token, Duration::from_secs(30))
            .await
            .with_context(|| format!("reading the agent's metrics at {url}"))?;
        tracer_client::cost::series::from_exposition(&text, &node, &format!("the agent's /metrics at {url}"))?
    } else {
        let mut connect = a.connect.clone();
        connect.connect.get_or_insert_with(|| DEFAULT_LISTEN.to_string());
        let conn = connect.settings()?.context("an API address")?;
        let mut client = api_client::connect(&conn).await?;
        let start = Instant::now();
        let snap = loop {
            let r = client.get_snapshot(v1::GetSnapshotRequest {}).await.context("GetSnapshot")?;
            let proto = r.into_inner().snapshot.context("the agent's GetSnapshot response has no snapshot")?;
            let snap = snapshot_from_proto(proto).context("reading the agent's snapshot")?;
            if !snap.first_interval_pending() || start.elapsed() >= COST_WAIT {
                break snap;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        let node = a
            .node
            .clone()
            .or_else(|| snap.kubernetes.watcher.as_ref().map(|w| w.node.clone()).filter(|n| !n.is_empty()))
            .unwrap_or_else(|| conn.addr.to_string());
        cost::from_snapshot(&snap, &node)?
    };
    let report = cost::Report::build(input, &a.by, a.policy);
    let text = match a.format {
        CostFormat::Table => tracer_client::cost::render::table(&report, top::terminal_width()),
        CostFormat::Csv => tracer_client::cost::render::csv(&report),
        CostFormat::Json => tracer_client::cost::render::json(&report),
    };
    let mut stdout = std::io::stdout();
    stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()).context("writing the report to stdout")?;
    if a.format != CostFormat::Table {
        for w in &report.warnings {
            note!("warning: {w}");
        }
    }
    Ok(())
}

async fn run_doctor(cfg: Config, a: DoctorArgs) -> Result<()> {
    let report = doctor::run(&cfg).await;
    let text = if a.json { report.to_json()? + "\n" } else { report.render_text() };
    let mut stdout = std::io::stdout();
    stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()).context("writing the report to stdout")?;
    if report.failed() {
        std::process::exit(1);
    }
    Ok(())
}

/// The node agent: the pipeline, with /metrics, /healthz and /readyz served on `--listen` and the
/// gRPC API (events, snapshot, status) on `api.listen`.
async fn run_agent(mut cfg: Config, a: AgentArgs) -> Result<()> {
    use std::sync::Arc;
    use tracer_agent::{
        export::{
            api::{
                listen::{self, ListenSettings},
                service::ApiState,
            },
            http::{HealthSettings, ServeLimits, ServeSecurity, ServeState, serve_secure},
            metrics::MetricsRegistry,
            otlp::{OtlpExporter, OtlpSettings, ResourceInfo},
        },
        profile::desk::ProfileDesk,
    };
    use tracer_core::config::api::HubSettings;

    /// Heartbeat every step; every event to the hub (and OTLP); a snapshot published every tick.
    struct Publish {
        serve: Arc<ServeState>,
        api: Arc<ApiState>,
        last_batch: Instant,
        otlp: Option<OtlpExporter>,
        /// The node's bill into the event stream, once a minute.
        bills: cost::bill::BillWriter,
        /// Profiling sessions (`profile --connect`).
        profiles: ProfileDesk,
    }
    /// The hub and, when OTLP export is on, the exporter (which keeps the kinds it exports).
    struct Tee<'a> {
        hub: &'a EventHub,
        otlp: Option<&'a OtlpExporter>,
    }
    impl Tee<'_> {
        /// Does the hub or OTLP take an event of this kind? (Decides before the message is built:
        /// most ioctls are RM controls, which nobody takes while no one subscribes.)
        fn wants_kind(&self, kind: i32) -> bool {
            self.hub.wants_kind(kind) || self.otlp.is_some_and(|o| o.wants(kind))
        }
        /// A decoded event, converted only when someone takes its kind.
        fn event(&mut self, ev: &tracer_core::decode::Event, ctx: &EventContext) {
            if self.wants_kind(kind_of(ev, ctx) as i32) {
                self.emit(to_proto(ev, ctx));
            }
        }
    }
    impl Emit for Tee<'_> {
        fn wants(&self) -> bool {
            self.otlp.is_some() || self.hub.wants_events()
        }
        /// One encoding of the event, shared by the hub's subscribers and the OTLP queue.
        fn emit(&mut self, ev: v1::Event) {
            let kind = ev.header.as_ref().map_or(0, |h| h.kind);
            let otlp = self.otlp.filter(|o| o.accepts(&ev));
            let hub = self.hub.wants_kind(kind);
            if otlp.is_none() && !hub {
                return;
            }
            let key = tracer_core::wire::filter::EventKey::of(&ev);
            let encoded = EventHub::encode(&ev);
            drop(ev);
            match otlp {
                Some(o) if hub => {
                    o.offer_encoded(encoded.clone());
                    self.hub.publish_encoded(key, encoded);
                }
                Some(o) => o.offer_encoded(encoded),
                None => self.hub.publish_encoded(key, encoded),
            }
        }
    }
    impl runner::Handler for Publish {
        type Error = anyhow::Error;
        fn event(&mut self, ev: &tracer_core::decode::Event, ctx: &EventContext) {
            Tee { hub: &self.api.hub, otlp: self.otlp.as_ref() }.event(ev, ctx);
        }
        fn stepped(&mut self, agent: &mut Agent) {
            self.serve.heartbeat();
            // A session's edges: the ring buffer drained and the launch counts sent, so that what
            // the window counted is exactly what its stream carries.
            let (hub, otlp, last_batch) = (&self.api.hub, self.otlp.as_ref(), &mut self.last_batch);
            self.profiles.serve(agent, hub, &mut |agent| {
                let mut tee = Tee { hub, otlp };
                agent.drain(&mut |ev, ctx| tee.event(ev, ctx));
                emit_launch_batches(&mut tee, agent, last_batch.elapsed());
                *last_batch = Instant::now();
            });
            // Subscribers are woken once per step for the events it applied, not once per event.
            self.api.hub.flush();
        }
        fn tick(&mut self, agent: &mut Agent) -> Result<Flow> {
            let hub = self.api.hub.clone();
            let mut tee = Tee { hub: &hub, otlp: self.otlp.as_ref() };
            agent.drain(&mut |ev, ctx| tee.event(ev, ctx));
            emit_launch_batches(&mut tee, agent, self.last_batch.elapsed());
            self.last_batch = Instant::now();
            let mut snap = agent.snapshot();
            if let Some(ev) = self.bills.due(&snap, tracer_core::clock::wall_now_unix_ns()) {
                tee.emit(ev);
            }
            emit_violations(&mut tee, agent);
            snap.otlp = self.otlp.as_ref().map(OtlpExporter::stats);
            snap.api = Some(self.api.hub.stats());
            snap.http = Some(self.serve.http_stats());
            let snap = Arc::new(snap);
            if let Some(o) = &self.otlp {
                o.publish(snap.clone());
            }
            self.serve.publish(snap);
            self.api.hub.flush();
            self.api.set_report(agent.report().clone());
            Ok(Flow::Continue)
        }
    }

    if let Some(l) = &a.grpc_listen {
        cfg.api.listen = l.clone();
        cfg.validate()?;
    }
    let interval = Duration::from_millis(cfg.snapshot_interval_ms.max(100));
    let api_addr = cfg.api.addr()?;
    let api_listen = match api_addr {
        Some(addr) => Some(ListenSettings {
            addr,
            tls: cfg.api.tls_cert.clone().zip(cfg.api.tls_key.clone()),
            token: match &cfg.api.token_file {
                Some(p) => Some(
                    std::fs::read_to_string(p)
                        .with_context(|| format!("reading api.token_file {}", p.display()))?
                        .trim()
                        .to_string(),
                ),
                None => None,
            },
        }),
        None => None,
    };
    let hub = Arc::new(
        EventHub::new(HubSettings {
            history: cfg.api.history,
            subscriber_buffer: cfg.api.subscriber_buffer,
            max_subscribers: cfg.api.max_subscribers,
        })
        .with_history_kinds(cfg.api.history_kinds()?),
    );
    // OTLP settings are checked before the probes load (a bad value is a clear error, early).
    let otlp_settings = OtlpSettings::resolve(&cfg.otlp, |k| std::env::var(k).ok())?;
    let cgroup_label = cfg.metrics.cgroup_label;
    // TLS material and the token are read before the probes load, too.
    let security = ServeSecurity::load(
        cfg.metrics.tls_cert.as_deref(),
        cfg.metrics.tls_key.as_deref(),
        cfg.metrics.token_file.as_deref(),
    )
    .context("the metrics endpoint's TLS or token")?;
    let otlp_who = ResourceInfo::detect(cfg.kubernetes.node_name.as_deref());
    let (profiles, profile_control) = ProfileDesk::new(
        PathBuf::from(tracer_agent::profile::session::LOCK_DIR),
        cfg.families.cuda && cfg.cuda_timed_calls,
    );
    let bills = tracer_agent::export::bill_writer_for_this_process(cfg.kubernetes.node_name.as_deref());
    let mut agent = Agent::start(cfg).context("starting the tracer")?;
    agent.start_kubernetes().await.context("starting Kubernetes identity")?;
    log_report(&agent);
    let otlp = OtlpExporter::start(otlp_settings, &otlp_who).context("starting OTLP export")?;
    let registry = MetricsRegistry::new().with_process_metrics().with_cgroup_label(cgroup_label);
    let state = Arc::new(ServeState::new(registry, HealthSettings::default()).with_token(security.token.clone()));
    state.mark_attached(agent.report().attach_mode.as_str());
    let api =
        Arc::new(ApiState::new(hub.clone(), state.clone(), agent.report().clone()).with_profiles(profile_control));
    let scheme = if security.tls.is_some() { "https" } else { "http" };
    let server = serve_secure(a.listen, state.clone(), ServeLimits::default(), security.tls.clone())
        .await
        .context("starting the metrics server")?;
    tracing::info!(listen = %server.local_addr, scheme, token = security.token.is_some(), "serving /metrics, /healthz, /readyz");
    note!("gpu-tracer agent: serving {scheme}://{}/metrics", server.local_addr);
    let api_server = match &api_listen {
        Some(l) => {
            let s = listen::serve(l, api.clone()).await.context("starting the gRPC API (api.listen, --grpc-listen)")?;
            note!("gpu-tracer agent: serving the gRPC API on {}", s.addr);
            Some(s)
        }
        None => None,
    };
    let schedule =
        Schedule { interval, tick_at_start: true, duration: a.duration.and_then(Schedule::duration_from_secs) };
    let mut publish = Publish { serve: state, api, last_batch: Instant::now(), otlp, bills, profiles };
    let result = runner::run(&mut agent, schedule, &mut publish).await;
    hub.close();
    if let Some(o) = publish.otlp.take() {
        let s = o.shutdown(Duration::from_secs(5));
        tracing::info!(
            metric_points = s.metric_points_exported,
            log_records = s.log_records_exported,
            dropped = s.dropped.iter().map(|d| d.count).sum::<u64>(),
            "OTLP export stopped"
        );
    }
    if let Some(s) = api_server {
        s.shutdown(Duration::from_secs(2)).await;
    }
    result?;
    server.shutdown().await.context("stopping the metrics server")?;
    Ok(())
}

fn main() {
    // Before any thread: the allocator's limits for a long-running process (tracer_agent::memory).
    tracer_agent::memory::tune();
    // An expected error (a bad flag value, a missing device, probes that cannot attach) is a
    // message naming the cause and the fix, never a backtrace, whatever RUST_BACKTRACE says:
    // anyhow's `Debug` would print one, so the chain is printed here instead.
    if let Err(e) = run() {
        note!("error: {e}");
        for cause in e.chain().skip(1) {
            note!("  caused by: {cause}");
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
        // A log line that cannot be written (stderr full or closed) is dropped: the subscriber's
        // own report of that failure would be an `eprintln!`, which panics on the same stderr.
        .log_internal_errors(false)
        .init();
    let cfg = build_config(&cli.common, ConfigUse::of(&cli.command))?;
    let rt = match cli.command {
        // The agent serves its API from worker threads beside the loop (which stays on this one).
        Command::Agent(_) => tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?,
        _ => tokio::runtime::Builder::new_current_thread().enable_all().build()?,
    };
    match cli.command {
        Command::Top(a) => rt.block_on(run_top(cfg, a)),
        Command::Events(a) => rt.block_on(run_events(cfg, *a)),
        Command::Profile(a) => rt.block_on(run_profile(cfg, *a)),
        Command::Doctor(a) => rt.block_on(run_doctor(cfg, a)),
        Command::Agent(a) => rt.block_on(run_agent(cfg, a)),
        Command::Api(a) => rt.block_on(run_api(a)),
        Command::Cost(a) => rt.block_on(run_cost(*a)),
    }
}
