//! `gpu-tracer events`: every event as length-delimited `gputracer.v1.Event`s or JSON lines, from
//! this node's own probes or from a running agent's `Subscribe` stream (`--connect`).
use std::{
    io::Write,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use clap::Args;
use gpu_tracer_proto::v1;
use tracer_agent::{
    export::{
        bill_writer_for_this_process,
        stream::{self, Emit},
    },
    pipeline::Agent,
    runner::{self, Flow, Handler as _, Schedule},
};
use tracer_client::{
    api::{self as api_client, ConnectArgs, ConnectSettings, FilterArgs},
    events::{EventFormat, EventStream, EventWriter},
};
use tracer_core::{
    config::{Config, parse_seconds},
    cost,
    filter::Filters,
    model::EventContext,
    wire::events::to_proto,
};

#[derive(Args)]
pub(crate) struct EventsArgs {
    /// JSON lines instead of length-delimited protobuf.
    #[arg(long)]
    pub(crate) json: bool,
    /// Write to this file instead of stdout.
    #[arg(long, short)]
    pub(crate) output: Option<PathBuf>,
    /// Stop after this many seconds.
    #[arg(long, value_parser = parse_seconds)]
    pub(crate) duration: Option<f64>,
    /// Stop after this many events.
    #[arg(long)]
    pub(crate) count: Option<u64>,
    /// Print a summary (events, accounting identity) to stderr at the end.
    #[arg(long)]
    pub(crate) summary: bool,
    /// Per-event mode for this process: every kernel launch as its own event (grid, block, shared
    /// memory, stream, kernel name), and every synchronisation, copy and memset timed
    /// (`cuda_call`), on top of the counts. Repeatable.
    #[arg(long = "per-event-pid", value_name = "PID")]
    pub(crate) per_event_pids: Vec<u32>,
    /// Per-event mode for this cgroup (a path relative to the cgroup2 mount, as in
    /// /proc/PID/cgroup, or a numeric cgroup id). Repeatable.
    #[arg(long = "per-event-cgroup", value_name = "PATH|ID")]
    pub(crate) per_event_cgroups: Vec<String>,
    #[command(flatten)]
    pub(crate) filter: FilterArgs,
    #[command(flatten)]
    pub(crate) connect: ConnectArgs,
    /// With --connect: first replay the agent's recent events from the last this many seconds.
    #[arg(long, value_name = "SECONDS", requires = "connect", value_parser = parse_seconds)]
    pub(crate) since: Option<f64>,
    /// With --connect: first replay the newest N matching events the agent still holds.
    #[arg(long, value_name = "N", requires = "connect", conflicts_with = "first")]
    pub(crate) last: Option<u64>,
    /// With --connect: first replay the oldest N matching events the agent still holds.
    #[arg(long, value_name = "N", requires = "connect")]
    pub(crate) first: Option<u64>,
    /// With --connect: stop after the replay instead of following new events.
    #[arg(long, requires = "connect")]
    pub(crate) no_follow: bool,
}

pub(crate) async fn run_events(cfg: Config, a: EventsArgs) -> Result<()> {
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
    let bills = bill_writer_for_this_process(cfg.kubernetes.node_name.as_deref());
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
    agent.log_report();
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

/// `events --connect`: the agent's event stream (filtered by the agent), written as a standalone
/// `events` writes it; events the agent could not hand over in time are counted and said. In
/// protobuf the agent's bytes are written as received (never decoded and encoded again).
pub(crate) async fn run_events_remote(
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
            _ = tracer_core::stop::wait() => break,
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
    pub(crate) stream: EventStream<Box<dyn Write + Send>>,
    pub(crate) filters: Filters,
    pub(crate) last_batch: Instant,
    /// The node's bill, once a minute.
    pub(crate) bills: cost::bill::BillWriter,
}

impl EventOut {
    /// Launch counts since the last batch and the violations raised since, as events; with
    /// `snapshot`, NVML is sampled (and the guardrails checked) first when the snapshot interval
    /// says so.
    fn batches(&mut self, agent: &mut Agent, snapshot: bool) {
        let interval = self.last_batch.elapsed();
        stream::launch_batches(self, agent, interval);
        if snapshot {
            let snap = agent.snapshot();
            if let Some(ev) = self.bills.due(&snap, tracer_core::clock::wall_now_unix_ns()) {
                Emit::emit(self, ev);
            }
        }
        stream::violations(self, agent);
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
