//! `gpu-tracer top`: each GPU's memory, SM share, energy and cost per container, from this node's
//! own probes or from a running agent's snapshots (`--connect`).
use std::{
    io::Write,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use clap::Args;
use gpu_tracer_proto::v1;
use tracer_agent::{
    pipeline::Agent,
    runner::{self, Flow, Schedule},
};
use tracer_client::{
    api::{self as api_client, ConnectArgs, ConnectSettings},
    top,
};
use tracer_core::{
    config::{Config, parse_seconds},
    wire::snapshot::snapshot_from_proto,
};

#[derive(Args)]
pub(crate) struct TopArgs {
    /// Print one snapshot and exit (for scripts): the first after --interval-ms whose attribution
    /// interval is complete (with NVML on, the shares, energy and bill are then real numbers, not
    /// zeros; waits at most 15 s).
    #[arg(long)]
    pub(crate) once: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Also list processes under each cgroup.
    #[arg(long)]
    pub(crate) per_process: bool,
    /// Refresh interval in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub(crate) interval_ms: u64,
    /// Stop after this many seconds (default: run until Ctrl-C or q).
    #[arg(long, value_parser = parse_seconds)]
    pub(crate) duration: Option<f64>,
    /// Only this namespace's pods on lines of their own (the others' become one line, so the
    /// totals still add up); on a terminal, `n` changes it.
    #[arg(long, value_name = "NAMESPACE")]
    pub(crate) namespace: Option<String>,
    /// Only this GPU: its index or (a prefix of) its UUID.
    #[arg(long, value_name = "INDEX|UUID")]
    pub(crate) gpu: Option<String>,
    #[command(flatten)]
    pub(crate) connect: ConnectArgs,
}

/// Whether `top` takes the terminal over (full screen, keys): stdout and stdin are terminals and
/// neither `--once` nor `--json` asks for text.
fn full_screen(a: &TopArgs) -> bool {
    use std::io::IsTerminal;
    !a.once && !a.json && std::io::stdout().is_terminal() && std::io::stdin().is_terminal()
}

fn view(a: &TopArgs, source: String) -> top::tui::View {
    let mut v = top::tui::View::new(source, Duration::from_millis(a.interval_ms.max(50)));
    v.namespace = a.namespace.clone();
    v.gpu = a.gpu.clone();
    v
}

/// How often the full screen looks at the keyboard and the clock.
const SCREEN_TICK: Duration = Duration::from_millis(50);

pub(crate) async fn run_top(cfg: Config, a: TopArgs) -> Result<()> {
    if let Some(conn) = a.connect.settings()? {
        return run_top_remote(conn, a).await;
    }
    let mut agent = Agent::start(cfg).context("starting the tracer")?;
    agent.start_kubernetes().await.context("starting Kubernetes identity")?;
    agent.log_report();
    if full_screen(&a) {
        let duration = a.duration.and_then(Schedule::duration_from_secs);
        let screen =
            top::tui::Screen::start(view(&a, "this node's probes".into())).context("taking over the terminal")?;
        let schedule = Schedule { interval: SCREEN_TICK, tick_at_start: true, duration };
        let mut out = ScreenOut { screen, error: None };
        runner::run(&mut agent, schedule, &mut out).await?;
        drop(out.screen);
        return out.error.map_or(Ok(()), Err);
    }
    // `top` stops at a tick (after printing), never between two: its duration is checked there.
    let schedule =
        Schedule { interval: Duration::from_millis(a.interval_ms.max(50)), tick_at_start: false, duration: None };
    runner::run(&mut agent, schedule, &mut TopOut::new(a)).await?;
    Ok(())
}

/// `top --connect`: the same tables from a running agent's snapshots (no probes loaded here).
pub(crate) async fn run_top_remote(conn: ConnectSettings, a: TopArgs) -> Result<()> {
    if a.json {
        anyhow::bail!(
            "--json with --connect: use `gpu-tracer api get-snapshot --json --connect {}` (the API's message as JSON)",
            conn.addr
        );
    }
    let mut client = api_client::connect(&conn).await?;
    if full_screen(&a) {
        let mut screen =
            top::tui::Screen::start(view(&a, format!("agent {}", conn.addr))).context("taking over the terminal")?;
        let until = a.duration.and_then(Schedule::duration_from_secs).map(|d| Instant::now() + d);
        let mut tick = tokio::time::interval(SCREEN_TICK);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = tracer_core::stop::wait() => return Ok(()),
            }
            if !screen.input() || until.is_some_and(|u| Instant::now() >= u) {
                return Ok(());
            }
            if screen.wants_snapshot() {
                let response = client
                    .get_snapshot(v1::GetSnapshotRequest {})
                    .await
                    .with_context(|| format!("GetSnapshot from the agent at {}", conn.addr))?;
                let proto =
                    response.into_inner().snapshot.context("the agent's GetSnapshot response has no snapshot")?;
                screen.update(snapshot_from_proto(proto).context("reading the agent's snapshot")?);
            }
            screen.draw().context("drawing the screen")?;
        }
    }
    let mut out = TopOut::new(a);
    let mut tick = tokio::time::interval(Duration::from_millis(out.args.interval_ms.max(50)));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = tracer_core::stop::wait() => return Ok(()),
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
    pub(crate) args: TopArgs,
    pub(crate) tty: bool,
    pub(crate) start: Instant,
    pub(crate) duration: Option<Duration>,
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
        // Names, commands and paths in the frame come from Kubernetes and /proc.
        let out = if a.json { out } else { tracer_core::format::printable(&out).into_owned() };
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

/// `top` on a terminal, from this node's probes: the keyboard and the clock every
/// [`SCREEN_TICK`], a snapshot every `--interval-ms` (unless paused).
struct ScreenOut {
    screen: top::tui::Screen,
    error: Option<anyhow::Error>,
}

impl runner::Handler for ScreenOut {
    type Error = anyhow::Error;
    fn tick(&mut self, agent: &mut Agent) -> Result<Flow> {
        agent.drain(&mut |_, _| {});
        if !self.screen.input() {
            return Ok(Flow::Stop);
        }
        if self.screen.wants_snapshot() {
            self.screen.update(agent.snapshot());
        }
        if let Err(e) = self.screen.draw() {
            self.error = Some(anyhow::Error::from(e).context("drawing the screen"));
            return Ok(Flow::Stop);
        }
        Ok(Flow::Continue)
    }
}
