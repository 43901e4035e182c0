//! `gpu-tracer-bench`: what the agent costs on this machine, measured in one run against baselines
//! taken in the same run, and written as a Markdown report (`--write docs/benchmarks.md`).
//!
//! Everything is reported as ratios and deltas; nothing here asserts a timing. A measurement that
//! cannot be made says why in its row (e.g. `not measured: bpftrace not installed`).
//!
//! Sections: (1) what syscalls that are not NVIDIA ioctls pay, against each attach mechanism's
//! empty-program floor; (2) what an NVIDIA RM_ALLOC ioctl pays, against bpftrace counting the same
//! calls; (3) ring-buffer ingest, offline and live under loss; (4) the agent's memory and CPU;
//! (5) what a libcuda launch pays under the agent's placed uprobe, one at the symbol address and
//! bpftrace's, and the launch rate the agent counts from two threads; (6) the attribution engine's
//! cost per interval on an 8-GPU × 100-container node (no kernel, no root); (7) one NVML pass on that
//! node against the fake library, and the agent-side memory of that node size; (8) the event API's
//! delivery to one and to 100 subscribers over its Unix socket; (9) the OTLP exporter's cost per export
//! on that node, and the agent-side memory with Prometheus, OTLP and 10 subscribers on; (10) the
//! fleet's bill from a real Prometheus holding a month of 100 nodes (`cost --prometheus`); (11) the
//! start-up scan of `/proc` with 2,000 extra processes.
//!
//! With `--only`, the sections not run keep their text from the report being overwritten.
mod agent_run;
mod api;
mod attribution;
mod bpftrace;
mod cost;
mod cuda;
mod driver_entry;
mod exporters;
mod floors;
mod merge;
mod nvml;
mod offline;
mod profile;
mod progstats;
mod report;
mod scan;
mod session;
mod sys;
mod worker;

use std::{
    cell::RefCell,
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use clap::Parser;
use tracer_agent::probe::Probes;
use tracer_common::nv::{DEFAULT_DRIVER_VERSION, DriverAbi};
use tracer_core::{
    config::{AttachMode, Config, Families},
    decode::plan,
    model::probes::FamilyStatus,
};

use agent_run::Outcome;
use report::*;

#[derive(Parser, Debug, Clone)]
#[command(name = "gpu-tracer-bench", about = "Measure the gpu-tracer agent's overhead on this machine")]
pub struct Opts {
    /// Also write the Markdown report to this file (e.g. docs/benchmarks.md).
    #[arg(long)]
    write: Option<PathBuf>,
    /// Calls per run for the non-NVIDIA syscalls (section 1).
    #[arg(long, default_value_t = 1_000_000)]
    calls: u64,
    /// Runs per configuration (the median is reported).
    #[arg(long, default_value_t = 5)]
    runs: u32,
    /// Calls per run for the NVIDIA ioctl (section 2).
    #[arg(long, default_value_t = 200_000)]
    nv_calls: u64,
    /// Calls per producer thread in the loss test (section 3b).
    #[arg(long, default_value_t = 200_000)]
    flood_calls: u64,
    /// Producer threads in the loss test (default: one per CPU but the consumer's).
    #[arg(long)]
    producers: Option<usize>,
    /// Seconds the agent is left idle (section 4).
    #[arg(long, default_value_t = 5)]
    idle_secs: u64,
    /// A tenth of the calls, three runs: a smoke test of the bench itself.
    #[arg(long)]
    quick: bool,
    /// Rounds of section 5 (default: --runs, at most 3).
    #[arg(long)]
    cuda_runs: Option<u32>,
    /// cuLaunchKernel calls per thread in the 2-thread launch-rate test (section 5b).
    #[arg(long, default_value_t = 1_000_000)]
    cuda_launches: u64,
    /// Skip the bpftrace comparison.
    #[arg(long)]
    no_bpftrace: bool,
    /// Run only these sections (comma-separated: 1, 2, 3a, 3b, 4, 5, 6 or `attribution`, 7 or `nvml`, 8 or `api`, 9 or
    /// `exporters`, 10 or `cost`, 11 or `scan`, 12 or `profile`, 13 or `session`); with
    /// --write, the others keep their text from the file being overwritten (or say "skipped").
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
}

impl Opts {
    fn wants(&self, section: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|s| s == section)
    }
}

/// Where things run.
pub struct Ctx {
    pub opts: Opts,
    pub machine: sys::Machine,
    /// CPU the measured worker runs on.
    pub worker_cpu: usize,
    /// CPU of the bench process and the agent's consumer thread, when pinned.
    pub agent_cpu: Option<usize>,
    /// Directory holding the fake `nvidiactl` (tmpfs).
    pub fake_dir: PathBuf,
    /// Warm-up calls before timed runs.
    pub warmup: u64,
    /// Processes whose eBPF programs are part of the measurement (bpftrace while it runs).
    pub expected_tracer_pids: RefCell<Vec<u32>>,
    /// Other tracers found loaded around the last worker run (empty: a clean measurement).
    pub last_foreign: RefCell<Vec<String>>,
    /// Every other tracer seen during the bench.
    pub all_foreign: RefCell<BTreeSet<String>>,
    /// Ids of every eBPF program this process (or bpftrace) held at some point.
    pub known_ours: RefCell<BTreeSet<u32>>,
}

impl Ctx {
    fn fake_ctl(&self) -> String {
        self.fake_dir.join("nvidiactl").display().to_string()
    }

    pub fn foreign_tracers(&self) -> Vec<String> {
        progstats::foreign_tracers(&self.expected_tracer_pids.borrow(), &mut self.known_ours.borrow_mut())
    }

    /// Remember the programs this process holds now (they may outlive their fds briefly).
    pub fn note_ours(&self) {
        let _ = self.foreign_tracers();
    }

    /// Run the worker child with `args`; return its stdout lines. Notes in `last_foreign` whether
    /// other tracers were loaded just before or just after.
    fn worker(&self, args: &[String]) -> Result<Vec<String>> {
        let exe = std::env::current_exe().context("locating the bench binary")?;
        let mut foreign = self.foreign_tracers();
        let out = Command::new(exe)
            .arg("__worker")
            .args(args)
            .stderr(std::process::Stdio::inherit())
            .output()
            .context("running the worker")?;
        foreign.extend(self.foreign_tracers());
        foreign.sort();
        foreign.dedup();
        self.all_foreign.borrow_mut().extend(foreign.iter().cloned());
        *self.last_foreign.borrow_mut() = foreign;
        if !out.status.success() {
            bail!("worker {:?} failed: {}", args.first(), out.status);
        }
        Ok(String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect())
    }
}

/// The numbers after `key` on each line that starts with it.
fn values(lines: &[String], key: &str) -> Vec<Vec<f64>> {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
        .map(|rest| rest.split_whitespace().filter_map(|x| x.parse().ok()).collect())
        .collect()
}

/// `(cpu, wall)` ns/call of the first `key` line.
fn timing(lines: &[String], key: &str) -> Result<Timing> {
    match values(lines, key).first().map(Vec::as_slice) {
        Some([cpu, wall, ..]) => Ok(Timing { cpu: *cpu, wall: *wall }),
        _ => bail!("worker printed no `{key}` result"),
    }
}

/// The agent configuration every measured agent starts from.
fn agent_config(ctx: &Ctx, mode: AttachMode) -> Config {
    Config {
        attach_mode: mode,
        dev_dir: ctx.fake_dir.clone(),
        // The stand-in nvidiactl is a regular file: accepted by device and inode.
        simulated_devices: true,
        // 545+ layouts: the nested NV_MEMORY_ALLOCATION_PARAMS copy is the full 128 bytes.
        driver_version: Some("550.54.15".into()),
        // The cuda family is measured on its own in section 5; here it would only add ~40 uprobes on
        // the host's libcuda, which take seconds to detach after every session.
        families: Families { cuda: false, ..Families::default() },
        ..Config::default()
    }
}

const MODES: [AttachMode; 3] = [AttachMode::SyscallTracepoint, AttachMode::RawTracepoint, AttachMode::BtfTracepoint];

fn progress(msg: &str) {
    eprintln!("[bench] {msg}");
}

// ---------------------------------------------------------------------------------------------
// Section 1: syscalls that are not NVIDIA ioctls.

fn measure_syscalls(ctx: &Ctx) -> Result<(Timing, Timing)> {
    let lines = ctx.worker(&[
        "syscalls".into(),
        ctx.worker_cpu.to_string(),
        ctx.opts.calls.to_string(),
        "1".into(),
        ctx.warmup.to_string(),
    ])?;
    Ok((timing(&lines, "ioctl_null")?, timing(&lines, "getppid")?))
}

/// One configuration of section 1, attached for the duration of one run.
fn syscall_config_run(ctx: &Ctx, kind: SysKind, mode: Option<AttachMode>) -> Result<(Timing, Timing)> {
    match (kind, mode) {
        (SysKind::None, _) => measure_syscalls(ctx),
        (SysKind::FloorEnter | SysKind::FloorBoth, Some(mode)) => {
            let f = floors::attach(mode, kind == SysKind::FloorBoth, &["ioctl", "getppid"])?;
            let r = measure_syscalls(ctx);
            drop(f);
            r
        }
        (SysKind::Agent, Some(mode)) => {
            let abi = DriverAbi::for_version(DEFAULT_DRIVER_VERSION);
            let cfg = Config {
                attach_mode: mode,
                families: Families { cuda: false, ..Families::default() },
                ..Config::default()
            };
            let p = Probes::load(&cfg, &abi, &plan::capture_plans(&abi), &plan::alloc_param_sizes(&abi))?;
            if let FamilyStatus::Failed { error } = &p.report.driver {
                bail!("driver family failed to attach: {error}");
            }
            let r = measure_syscalls(ctx);
            drop(p);
            r
        }
        _ => bail!("bad configuration"),
    }
}

fn section_syscalls(ctx: &Ctx) -> SyscallSection {
    let mut rows = vec![SysRow::new(SysKind::None, None)];
    for mode in MODES {
        for kind in [SysKind::FloorEnter, SysKind::FloorBoth, SysKind::Agent] {
            rows.push(SysRow::new(kind, Some(mode)));
        }
    }
    // Rounds: every configuration once per round, so slow drift and bursts of other load on the
    // machine spread over all configurations instead of biasing one.
    for round in 0..ctx.opts.runs {
        progress(&format!("1: round {}/{} ({} configurations)", round + 1, ctx.opts.runs, rows.len()));
        for row in rows.iter_mut() {
            if row.ioctl.is_err() {
                continue;
            }
            match syscall_config_run(ctx, row.kind, row.mode) {
                Ok((a, b)) => {
                    if let (Ok(va), Ok(vb)) = (&mut row.ioctl, &mut row.getppid) {
                        va.push(a.cpu);
                        vb.push(b.cpu);
                        row.ioctl_wall.push(a.wall);
                        row.getppid_wall.push(b.wall);
                        row.dirty.push(!ctx.last_foreign.borrow().is_empty());
                    }
                }
                Err(e) => {
                    row.ioctl = Err(format!("{e:#}"));
                    row.getppid = Err(format!("{e:#}"));
                }
            }
        }
    }
    for row in rows.iter_mut() {
        row.drop_dirty_rounds();
    }
    SyscallSection { rows }
}

// ---------------------------------------------------------------------------------------------
// Section 2: the NVIDIA ioctl path.

fn measure_nv(ctx: &Ctx, calls: u64) -> Result<(Timing, u64)> {
    measure_nv_variant(ctx, calls, "full")
}

fn measure_nv_variant(ctx: &Ctx, calls: u64, variant: &str) -> Result<(Timing, u64)> {
    let lines = ctx.worker(&[
        "nv".into(),
        ctx.worker_cpu.to_string(),
        ctx.fake_ctl(),
        calls.to_string(),
        "1".into(),
        ctx.warmup.to_string(),
        variant.into(),
    ])?;
    let run = timing(&lines, "nv")?;
    let total =
        values(&lines, "total").first().and_then(|v| v.first().copied()).context("worker printed no total")? as u64;
    Ok((run, total))
}

/// One agent session around one NV run.
/// `VmRSS` and `(RssAnon, RssFile, RssShmem)`, in kB.
type RssAt = (u64, (u64, u64, u64));

/// One agent session around one NV run: timing, calls made, what the agent saw, BPF map memory,
/// and the RSS just before the agent started.
fn nv_agent_session(ctx: &Ctx, mode: AttachMode) -> Result<(Timing, u64, Outcome, u64, RssAt)> {
    let rss0 = (sys::status_kb("VmRSS").unwrap_or(0), sys::rss_parts());
    let running = agent_run::start(agent_config(ctx, mode), 0)?;
    if let Some(p) = running.started.driver_problem.clone() {
        let _ = running.finish();
        bail!("driver family not attached: {p}");
    }
    let memlock = sys::bpf_map_memlock();
    let m = measure_nv(ctx, ctx.opts.nv_calls);
    let outcome = running.finish()?;
    let (run, total) = m?;
    Ok((run, total, outcome, memlock, rss0))
}

fn section_nv(ctx: &Ctx, idle: &mut IdleSection) -> NvSection {
    let mut rows: Vec<NvRow> = [NvKind::None]
        .into_iter()
        .chain(MODES.map(NvKind::Agent))
        .chain([NvKind::Bpftrace])
        .map(|kind| NvRow { kind, result: Ok(NvMeasured::default()) })
        .collect();
    if ctx.opts.no_bpftrace {
        rows.last_mut().unwrap().result = Err("--no-bpftrace".into());
    } else if !bpftrace::available() {
        rows.last_mut().unwrap().result = Err("bpftrace not installed".into());
    }
    for round in 0..ctx.opts.runs {
        progress(&format!("2: round {}/{}", round + 1, ctx.opts.runs));
        for row in rows.iter_mut() {
            let Ok(acc) = &mut row.result else { continue };
            let r: Result<()> = match row.kind {
                NvKind::None => measure_nv(ctx, ctx.opts.nv_calls).map(|(run, total)| {
                    acc.push(run, !ctx.last_foreign.borrow().is_empty());
                    acc.total += total;
                }),
                NvKind::Agent(mode) => nv_agent_session(ctx, mode).map(|(run, total, outcome, memlock, rss0)| {
                    acc.push(run, !ctx.last_foreign.borrow().is_empty());
                    acc.total += total;
                    acc.sessions.push(outcome);
                    acc.memlock = memlock;
                    (acc.rss_before_kb, acc.rss_before_parts) = rss0;
                }),
                NvKind::Bpftrace => {
                    bpftrace::while_attached(ctx, || measure_nv(ctx, ctx.opts.nv_calls)).map(|((run, total), n)| {
                        acc.push(run, !ctx.last_foreign.borrow().is_empty());
                        acc.total += total;
                        *acc.bpftrace_count.get_or_insert(0) += n;
                    })
                }
            };
            // A failed round (bpftrace not exiting in time, say) is noted and the next round tries
            // again; a row without any successful round says why.
            if let Err(e) = r {
                let e = format!("{e:#}");
                progress(&format!("2: {:?}: {e}", row.kind));
                if let Ok(acc) = &mut row.result {
                    acc.failures.push(e);
                }
            }
        }
    }
    for row in rows.iter_mut() {
        if let Ok(m) = &row.result
            && m.runs.is_empty()
            && let Some(e) = m.failures.first()
        {
            row.result = Err(e.clone());
        }
    }
    for row in rows.iter_mut() {
        if let Ok(m) = &mut row.result {
            m.drop_dirty_rounds();
        }
    }
    if let Some(Ok(m)) = rows.iter().find(|r| r.kind == NvKind::Agent(AttachMode::BtfTracepoint)).map(|r| &r.result) {
        idle.loaded = Some(m.clone());
    }
    NvSection { rows, stats: section_progstats(ctx) }
}

/// Section 2b: the kernel's run-time statistics of our programs during one NV run per mode, then
/// per workload variant (btf-tracepoint), then the empty programs as the reference.
fn section_progstats(ctx: &Ctx) -> Result<Vec<StatsRow>, String> {
    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).map_err(|e| format!("BPF_ENABLE_STATS: {e}"))?;
    let mut out = Vec::new();
    let mut plan: Vec<(AttachMode, &str, bool)> = MODES.iter().map(|m| (*m, "full", false)).collect();
    plan.extend([
        (AttachMode::BtfTracepoint, "no-nested", false),
        (AttachMode::BtfTracepoint, "bare", false),
        (AttachMode::BtfTracepoint, "full", true),
    ]);
    for (mode, variant, floor) in plan {
        progress(&format!(
            "2b: in-program time, {} {variant}{}",
            mode.as_str(),
            if floor { " (empty programs)" } else { "" }
        ));
        let r = (|| -> Result<StatsRow> {
            let (guard, running) = if floor {
                (Some(floors::attach(mode, true, &["ioctl"])?), None)
            } else {
                let running = agent_run::start(agent_config(ctx, mode), 0)?;
                if let Some(p) = running.started.driver_problem.clone() {
                    let _ = running.finish();
                    bail!("{}: driver family not attached: {p}", mode.as_str());
                }
                (None, Some(running))
            };
            let before = progstats::read();
            let m = measure_nv_variant(ctx, ctx.opts.nv_calls, variant);
            let after = progstats::read();
            // Names are looked up while the programs are still loaded.
            let names = progstats::names(after.keys().copied());
            if let Some(running) = running {
                running.finish()?;
            }
            drop(guard);
            let (_, total) = m?;
            Ok(StatsRow {
                mode,
                variant: variant.to_string(),
                floor,
                calls: total,
                progs: progstats::delta(&before, &after, &names),
            })
        })();
        out.push(r.map_err(|e| format!("{e:#}"))?);
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Section 3: ingest.

fn section_flood(ctx: &Ctx) -> FloodSection {
    let producers = ctx.opts.producers.unwrap_or_else(|| ctx.machine.nproc.saturating_sub(1).max(1));
    // Producers on every CPU but the consumer's (all CPUs when there is only one).
    let cpus: Vec<usize> = (0..producers)
        .map(|i| {
            let others: Vec<usize> = (0..ctx.machine.nproc).filter(|c| Some(*c) != ctx.agent_cpu).collect();
            if others.is_empty() { 0 } else { others[i % others.len()] }
        })
        .collect();
    let cpu_list = cpus.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",");
    // Ring sizes with a consumer at full speed, then the smallest ring with a consumer slowed down.
    let configs: Vec<(u32, u64)> = [64u32 << 10, 256 << 10, 1 << 20, 8 << 20]
        .into_iter()
        .map(|r| (r, 0))
        .chain([1_000u64, 2_000, 4_000, 8_000, 16_000].into_iter().map(|spin| (64 << 10, spin)))
        .collect();
    let mut rows = Vec::new();
    for (ring, spin) in configs {
        progress(&format!("3b: ring {} KiB, consumer +{} ns/event", ring >> 10, spin));
        let r = (|| -> Result<FloodMeasured> {
            let cfg = Config { ring_buffer_bytes: ring, ..agent_config(ctx, AttachMode::Auto) };
            let running = agent_run::start(cfg, spin)?;
            if let Some(p) = running.started.driver_problem.clone() {
                let _ = running.finish();
                bail!("driver family not attached: {p}");
            }
            let mode = running.started.attach_mode.clone();
            let lines =
                ctx.worker(&["flood".into(), ctx.fake_ctl(), ctx.opts.flood_calls.to_string(), cpu_list.clone()]);
            let outcome = running.finish()?;
            let lines = lines?;
            let l = lines.iter().find_map(|l| l.strip_prefix("flood ")).context("worker printed no result")?;
            let v: Vec<u64> = l.split_whitespace().filter_map(|x| x.parse().ok()).collect();
            if v.len() != 3 {
                bail!("bad worker output {l:?}");
            }
            Ok(FloodMeasured { mode, elapsed_ns: v[0], calls: v[1], producers: v[2] as usize, agent: outcome })
        })();
        rows.push(FloodRow { ring_bytes: ring, spin_ns: spin, result: r.map_err(|e| format!("{e:#}")) });
    }
    FloodSection { rows, producer_cpus: cpus }
}

fn section_offline(ctx: &Ctx) -> OfflineSection {
    progress("3a: offline decode + state apply");
    let cycles = if ctx.opts.quick { 1_000 } else { 10_000 };
    let r = offline::build(4, cycles, 64).map(|c| {
        let t = offline::measure(&c, 5);
        (c.mix, t)
    });
    OfflineSection { result: r.map_err(|e| format!("{e:#}")) }
}

// ---------------------------------------------------------------------------------------------
// Section 4: idle agent.

fn section_idle(ctx: &Ctx) -> IdleSection {
    progress(&format!("4: idle agent for {} s", ctx.opts.idle_secs));
    let rss_baseline_kb = sys::status_kb("VmRSS").unwrap_or(0);
    let rss_baseline_parts = sys::rss_parts();
    let r = (|| -> Result<IdleMeasured> {
        // Production defaults: /dev, auto mode, 8 MiB ring.
        let running = agent_run::start(Config::default(), 0)?;
        ctx.note_ours();
        let rss_started_kb = sys::status_kb("VmRSS").unwrap_or(0);
        let rss_started_parts = sys::rss_parts();
        let memlock = sys::bpf_map_memlock();
        std::thread::sleep(Duration::from_secs(ctx.opts.idle_secs));
        let rss_idle_kb = sys::status_kb("VmRSS").unwrap_or(0);
        let mode = running.started.attach_mode.clone();
        let outcome = running.finish()?;
        Ok(IdleMeasured { mode, rss_started_kb, rss_started_parts, rss_idle_kb, memlock, outcome })
    })();
    IdleSection { rss_baseline_kb, rss_baseline_parts, idle: r.map_err(|e| format!("{e:#}")), loaded: None }
}

// ---------------------------------------------------------------------------------------------

fn ensure_tracefs() -> Option<String> {
    if Path::new("/sys/kernel/tracing/events").exists() {
        return None;
    }
    let ok = Command::new("mount")
        .args(["-t", "tracefs", "tracefs", "/sys/kernel/tracing"])
        .status()
        .is_ok_and(|s| s.success());
    if ok { Some("tracefs was not mounted; mounted it at /sys/kernel/tracing".into()) } else { None }
}

struct FakeDir(PathBuf);
impl Drop for FakeDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("__worker") {
        return worker::main(&args[2..]);
    }
    if args.get(1).map(String::as_str) == Some("driver-entry") {
        return driver_entry::main(&args[2..]);
    }
    if args.get(1).map(String::as_str) == Some("__rss") {
        return nvml::rss_main(&args[2..]);
    }
    if args.get(1).map(String::as_str) == Some("__exporters_rss") {
        return exporters::rss_main(&args[2..]);
    }
    let mut opts = Opts::parse();
    if opts.quick {
        opts.calls /= 10;
        opts.nv_calls /= 10;
        opts.flood_calls /= 10;
        opts.cuda_launches /= 10;
        opts.runs = opts.runs.min(3);
        opts.idle_secs = opts.idle_secs.min(2);
    }
    if opts.calls == 0 || opts.nv_calls == 0 || opts.runs == 0 {
        bail!("--calls, --nv-calls and --runs must be positive");
    }
    if let Some(bad) = opts.only.iter().find(|o| !merge::known_keys().any(|k| k == o.as_str())) {
        bail!("--only {bad}: not a section; use {}", merge::known_keys().collect::<Vec<_>>().join(", "));
    }
    let t0 = Instant::now();
    let load_start = sys::loadavg();
    let nproc = sys::online_cpus();
    let machine = sys::Machine::detect(nproc);
    let mut notes = Vec::new();
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        notes.push(
            "not running as root: every measurement that loads eBPF programs will fail (needs CAP_BPF and CAP_PERFMON)"
                .to_string(),
        );
    }
    if let Some(n) = ensure_tracefs() {
        notes.push(n);
    }
    // The bench process (and the agent's consumer thread, which inherits it) on CPU 0, the measured
    // worker on the last CPU.
    let (agent_cpu, worker_cpu) = if nproc >= 2 {
        match sys::pin_to(0) {
            Ok(()) => (Some(0), nproc - 1),
            Err(e) => {
                notes.push(format!("could not pin the bench to CPU 0: {e}"));
                (None, nproc - 1)
            }
        }
    } else {
        notes.push("one CPU: the agent's consumer and the measured calls share it".into());
        (None, 0)
    };
    let base = if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
    let fake = FakeDir(base.join(format!("gpu-tracer-bench-{}", std::process::id())));
    std::fs::create_dir_all(&fake.0).with_context(|| format!("creating {}", fake.0.display()))?;
    std::fs::write(fake.0.join("nvidiactl"), b"").context("creating the fake nvidiactl")?;
    let warmup = (opts.calls / 20).clamp(1_000, 50_000);
    let ctx = Ctx {
        opts: opts.clone(),
        machine,
        worker_cpu,
        agent_cpu,
        fake_dir: fake.0.clone(),
        warmup,
        expected_tracer_pids: RefCell::new(vec![]),
        last_foreign: RefCell::new(vec![]),
        all_foreign: RefCell::new(BTreeSet::new()),
        known_ours: RefCell::new(BTreeSet::new()),
    };

    const SKIPPED: &str = "skipped (--only)";
    let mut idle = if opts.wants("4") {
        section_idle(&ctx)
    } else {
        IdleSection { rss_baseline_kb: 0, rss_baseline_parts: (0, 0, 0), idle: Err(SKIPPED.into()), loaded: None }
    };
    let sys_section = if opts.wants("1") { section_syscalls(&ctx) } else { SyscallSection { rows: vec![] } };
    let nv = if opts.wants("2") {
        section_nv(&ctx, &mut idle)
    } else {
        NvSection { rows: vec![], stats: Err(SKIPPED.into()) }
    };
    let flood =
        if opts.wants("3b") { section_flood(&ctx) } else { FloodSection { rows: vec![], producer_cpus: vec![] } };
    let hwm_kb = sys::status_kb("VmHWM").unwrap_or(0);
    let off = if opts.wants("3a") { section_offline(&ctx) } else { OfflineSection { result: Err(SKIPPED.into()) } };
    let cuda = if opts.wants("5") { cuda::section(&ctx) } else { cuda::CudaSection::skipped(SKIPPED) };
    let attribution = if opts.wants("6") || opts.wants("attribution") {
        attribution::section(opts.quick)
    } else {
        attribution::AttributionSection::skipped(SKIPPED)
    };
    let nvml_section = if opts.wants("7") || opts.wants("nvml") {
        nvml::section(&nvml::fake_dir(&fake.0), opts.quick)
    } else {
        nvml::NvmlSection::skipped(SKIPPED)
    };

    let api_section =
        if opts.wants("8") || opts.wants("api") { api::section(opts.quick) } else { api::ApiSection::skipped(SKIPPED) };
    let exporters_section = if opts.wants("9") || opts.wants("exporters") {
        exporters::section(opts.quick)
    } else {
        exporters::ExportersSection::skipped(SKIPPED)
    };

    let cost_section = if opts.wants("10") || opts.wants("cost") {
        cost::section(opts.quick)
    } else {
        cost::CostSection::skipped(SKIPPED)
    };

    let scan_section = if opts.wants("11") || opts.wants("scan") {
        scan::section(&fake.0, opts.quick)
    } else {
        scan::ScanSection::skipped(SKIPPED)
    };

    let profile_section = if opts.wants("12") || opts.wants("profile") {
        profile::section(opts.quick)
    } else {
        profile::ProfileSection::skipped(SKIPPED)
    };

    let session_section = if opts.wants("13") || opts.wants("session") {
        session::section(opts.quick)
    } else {
        session::SessionSection::skipped(SKIPPED)
    };

    let load_end = sys::loadavg();
    let doc = Report {
        ctx: &ctx,
        notes,
        syscalls: sys_section,
        nv,
        flood,
        offline: off,
        idle,
        cuda,
        attribution,
        nvml: nvml_section,
        api: api_section,
        exporters: exporters_section,
        cost: cost_section,
        scan: scan_section,
        profile: profile_section,
        session: session_section,
        hwm_before_offline_kb: hwm_kb,
        load: (load_start, load_end),
        foreign: ctx.all_foreign.borrow().iter().cloned().collect(),
        elapsed: t0.elapsed(),
    }
    .render();
    println!("{doc}");
    if let Some(p) = &opts.write {
        if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).ok();
        }
        let doc = match std::fs::read_to_string(p) {
            Ok(old) if !opts.only.is_empty() => {
                let (fresh, noted) = merge::fresh_blocks(&opts.only);
                let m = &ctx.machine;
                let note = format!(
                    "Re-run alone on {} (`--only {}`; {}, {} CPUs, kernel {}, load average {:.2} at start, {:.2} at \
                     end{}). The other sections and the machine table are from the earlier run.",
                    m.date_utc,
                    opts.only.join(","),
                    m.cpu_model,
                    m.nproc,
                    m.kernel,
                    load_start,
                    load_end,
                    if opts.quick { "; --quick" } else { "" }
                );
                merge::merge(&old, &doc, &fresh, &noted, &note)
            }
            // A full run: every section is new; the hand-written notes stay.
            Ok(old) => merge::keep_notes(&old, &doc),
            Err(_) => doc,
        };
        std::fs::write(p, &doc).with_context(|| format!("writing {}", p.display()))?;
        progress(&format!("wrote {}", p.display()));
    }
    progress(&format!("done in {:.0} s", t0.elapsed().as_secs_f64()));
    Ok(())
}

#[cfg(test)]
mod tests;
