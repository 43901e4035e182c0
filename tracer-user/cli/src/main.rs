//! `gpu-tracer`: per-container accounting of NVIDIA GPU usage, from eBPF probes on the driver.
use std::path::PathBuf;

use anyhow::{Context as _, Result};
use clap::{Args, Parser, Subcommand};
use tracer_core::config::{Config, Overrides};

/// A line for people on stderr. A stderr that cannot be written (full, closed) is no reason to stop
/// or to panic, as `eprintln!` would: the line is dropped.
/// What it prints may hold text from outside (an error body, a name from Kubernetes): control
/// characters are shown escaped, never sent to the terminal (`tracer_core::format::printable`).
macro_rules! note {
    ($($arg:tt)*) => {{
        let line = format!($($arg)*);
        let _ = std::io::Write::write_fmt(
            &mut std::io::stderr(),
            format_args!("{}\n", tracer_core::format::printable(&line)),
        );
    }};
}

mod agent;
mod api;
mod cost;
mod doctor;
mod events;
mod profile;
mod top;

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
    /// Log level filter (also RUST_LOG).
    #[arg(long, global = true, default_value = "warn")]
    log: String,
}

#[derive(Subcommand)]
enum Command {
    /// Live table of GPU memory per cgroup (container), refreshed in place.
    Top(top::TopArgs),
    /// Stream every event (length-delimited protobuf `gputracer.v1.Event`, or JSON lines).
    Events(Box<events::EventsArgs>),
    /// Check what works on this node: kernel features, privileges, driver, probes.
    Doctor(doctor::DoctorArgs),
    /// Run as the node agent: trace, attribute, and serve /metrics, /healthz, /readyz and the gRPC API.
    Agent(agent::AgentArgs),
    /// Call a running agent's gRPC API (no probes loaded here).
    Api(api::ApiArgs),
    /// The bill split per namespace, pod label, pod or node: from a running agent (since it
    /// started), over a period for a whole fleet from the Prometheus that scrapes the agents, or
    /// over a recorded events file.
    Cost(Box<cost::CostArgs>),
    /// Record one workload's GPU activity for a while (every kernel launch, allocation and free)
    /// into a Perfetto trace and a summary, without restarting it.
    Profile(Box<profile::ProfileArgs>),
}

/// What a command does with the configuration, so which checks it must pass before it runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ConfigUse {
    /// Loads probes here (`agent`, `top`, `events`): the values and the host paths must be right.
    Local,
    /// Reads a running agent (`top`/`events --connect`): only the values are checked.
    Remote,
    /// `doctor`: reports what is wrong (the `config` check) instead of refusing to look.
    Report,
    /// `api` and `cost`: the configuration is not read at all (the answers come from the agent,
    /// Prometheus or an events file).
    Unused,
}

impl ConfigUse {
    fn of(command: &Command) -> Self {
        match command {
            Command::Top(a) if a.connect.connect.is_some() => ConfigUse::Remote,
            Command::Events(a) if a.connect.connect.is_some() => ConfigUse::Remote,
            Command::Api(_) | Command::Cost(_) => ConfigUse::Unused,
            Command::Doctor(_) => ConfigUse::Report,
            Command::Top(_) | Command::Events(_) | Command::Agent(_) | Command::Profile(_) => ConfigUse::Local,
        }
    }
}

/// The subcommands that read no configuration and load no probes: the global flags that set
/// either (`--config` and every override) are left out of their `--help`, and given to them on
/// the command line they are an error naming the flag.
const NO_CONFIG_COMMANDS: [&str; 2] = ["api", "cost"];

/// The global flags that only configure probes and the agent (all but `--log`).
fn configuring(cmd: &clap::Command) -> Vec<clap::Arg> {
    cmd.get_arguments().filter(|a| a.is_global_set() && a.get_id() != "log").cloned().collect()
}

/// The command line's definition: [`Cli`], with [`NO_CONFIG_COMMANDS`] holding hidden copies of
/// the configuring flags (clap propagates a global flag only to subcommands without one of that
/// id), so that their `--help` shows what they read and [`refuse_configuring`] can name a flag.
fn command() -> clap::Command {
    use clap::CommandFactory as _;
    let mut cmd = Cli::command();
    let hidden: Vec<clap::Arg> = configuring(&cmd).into_iter().map(|a| a.hide(true)).collect();
    for name in NO_CONFIG_COMMANDS {
        cmd = cmd.mut_subcommand(name, |mut sc| {
            for a in &hidden {
                sc = sc.arg(a.clone());
            }
            sc
        });
    }
    cmd
}

/// A configuring flag given on the command line to a command of [`NO_CONFIG_COMMANDS`]: an error
/// rather than a setting silently ignored. (`GPU_TRACER_CONFIG` in the environment is not an
/// error: it is meant for the other commands.)
fn refuse_configuring(matches: &clap::ArgMatches) -> Result<()> {
    let Some((name, sub)) = matches.subcommand() else { return Ok(()) };
    if !NO_CONFIG_COMMANDS.contains(&name) {
        return Ok(());
    }
    let cmd = command();
    let given: Vec<String> = configuring(&cmd)
        .iter()
        .filter(|a| {
            let id = a.get_id().as_str();
            [matches.value_source(id), sub.value_source(id)].contains(&Some(clap::parser::ValueSource::CommandLine))
        })
        .map(|a| a.get_long().map(|l| format!("--{l}")).unwrap_or_else(|| a.get_id().to_string()))
        .collect();
    if given.is_empty() {
        return Ok(());
    }
    let why = match name {
        "cost" => "the bill comes from the agent (--connect), Prometheus (--prometheus) or an events file (--events)",
        _ => "the answers come from the running agent",
    };
    anyhow::bail!(
        "{} does nothing for `gpu-tracer {name}`: it loads no probes and reads no configuration ({why}); leave it \
         out (`gpu-tracer {name} --help` lists what it reads)",
        given.join(", ")
    )
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
        ConfigUse::Report | ConfigUse::Unused => {}
    }
    Ok(cfg)
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

/// What clap's `exit` does — help and version on stdout with exit 0, usage errors on stderr with
/// exit 2 — but a help or version text that cannot be written (stdout full or closed) is an error
/// naming why, exit 1, not a silent success.
fn exit_with(e: clap::Error) -> ! {
    use std::io::Write as _;
    let printed =
        e.print().and_then(|()| if e.use_stderr() { std::io::stderr().flush() } else { std::io::stdout().flush() });
    if let Err(io) = printed {
        if io.kind() == std::io::ErrorKind::BrokenPipe {
            // The reader stopped reading (`--help | head`): what it wanted, it got.
            std::process::exit(e.exit_code());
        }
        let what = if e.use_stderr() { "the usage error" } else { "the help or version text" };
        note!("error: writing {what}: {io}");
        std::process::exit(1);
    }
    std::process::exit(e.exit_code())
}

fn run() -> Result<()> {
    let matches = command().try_get_matches().unwrap_or_else(|e| exit_with(e));
    let cli = <Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap_or_else(|e| exit_with(e));
    refuse_configuring(&matches)?;
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| cli.common.log.clone());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        // A log line that cannot be written (stderr full or closed) is dropped: the subscriber's
        // own report of that failure would be an `eprintln!`, which panics on the same stderr.
        .log_internal_errors(false)
        .init();
    let how = ConfigUse::of(&cli.command);
    let cfg = if how == ConfigUse::Unused { Config::default() } else { build_config(&cli.common, how)? };
    // SIGINT and SIGTERM: a flag that is never lost, then the command's own orderly stop, bounded
    // (tracer_core::stop); a second signal stops at once. The grace period is what each stop may
    // need: `top` and `events` a final drain and write, the agent also the OTLP flush (5 s) and
    // the API's shutdown (2 s) within Kubernetes' default 30 s, `profile` writing its trace.
    let grace = match &cli.command {
        Command::Top(_) => Some(5),
        Command::Events(_) => Some(10),
        Command::Agent(_) => Some(20),
        Command::Profile(_) => Some(60),
        Command::Doctor(_) | Command::Api(_) | Command::Cost(_) => None,
    };
    if let Some(s) = grace {
        tracer_core::stop::install(std::time::Duration::from_secs(s)).context("handling SIGINT and SIGTERM")?;
    }
    let rt = match cli.command {
        // The agent serves its API from worker threads beside the loop (which stays on this one).
        Command::Agent(_) => tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?,
        _ => tokio::runtime::Builder::new_current_thread().enable_all().build()?,
    };
    match cli.command {
        Command::Top(a) => rt.block_on(top::run_top(cfg, a)),
        Command::Events(a) => rt.block_on(events::run_events(cfg, *a)),
        Command::Profile(a) => rt.block_on(profile::run_profile(cfg, *a)),
        Command::Doctor(a) => rt.block_on(doctor::run_doctor(cfg, a)),
        Command::Agent(a) => rt.block_on(agent::run_agent(cfg, a)),
        Command::Api(a) => rt.block_on(api::run_api(a)),
        Command::Cost(a) => rt.block_on(cost::run_cost(*a)),
    }
}
