//! `gpu-tracer-bench driver-entry`: what driver-entry mode costs against btf-tracepoint mode, side
//! by side in one run, on a kernel with kprobes and the kernel-module double of the NVIDIA driver
//! loaded (Debian's 6.1 under QEMU: `cargo xtask kernel-matrix --bench-driver-entry`).
//!
//! Per configuration (no agent, the agent in btf-tracepoint mode, the agent in driver-entry mode;
//! one of each per round, rounds interleaved so drift spreads over all three) a fresh worker opens
//! `/dev/nvidiactl` of the double while its server runs (so the open goes through the driver and
//! btf mode registers the fd), the server is then stopped, and the worker times `getppid`, a
//! foreign `ioctl(/dev/null)` and RM_ALLOC on the NVIDIA fd. Without a server the double copies
//! the 48-byte argument in and answers `-ENODEV` inside the kernel, so the NVIDIA call measures the
//! probes, not a round trip to user space; both agent modes decode and record every one of them.
//! Times are the worker thread's CPU time per call, medians over the rounds; under TCG they are
//! slow in absolute terms, the ratios are what count.
use std::{
    io::{BufRead, BufReader, Write},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};
use gpu_tracer_tests::FakeDriver;
use tracer_core::config::{AttachMode, Config, DriverEntryProbes, Families};

use crate::{agent_run, sys};

/// An attach mode and, for driver-entry, its mechanism.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Btf,
    Kprobe,
    Fentry,
    /// fentry with `ioctl_durations` (an fentry on the ioctl as well as its fexit).
    FentryTimed,
}

impl Mode {
    fn attach_mode(self) -> AttachMode {
        match self {
            Mode::Btf => AttachMode::BtfTracepoint,
            Mode::Kprobe | Mode::Fentry | Mode::FentryTimed => AttachMode::DriverEntry,
        }
    }

    fn probes(self) -> DriverEntryProbes {
        match self {
            Mode::Fentry | Mode::FentryTimed => DriverEntryProbes::Fentry,
            _ => DriverEntryProbes::Kprobe,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Mode::Btf => "btf-tracepoint",
            Mode::Kprobe => "driver-entry (kprobe)",
            Mode::Fentry => "driver-entry (fentry)",
            Mode::FentryTimed => "driver-entry (fentry, ioctls timed)",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Conf {
    None,
    /// The mode's empty programs where it attaches (its mechanism's floor).
    Floor(Mode),
    Agent(Mode),
}

impl Conf {
    fn name(self) -> String {
        match self {
            Conf::None => "no agent".into(),
            Conf::Floor(m) => format!("{}, empty programs", m.name()),
            Conf::Agent(m) => m.name().into(),
        }
    }
}

/// The timed phases, in the worker's order.
const PHASES: [&str; 3] = ["getppid", "ioctl_null", "nv"];

/// One configuration's per-call CPU times (ns), one value per round.
#[derive(Default)]
struct Row {
    getppid: Vec<f64>,
    null: Vec<f64>,
    nv: Vec<f64>,
    /// NVIDIA ioctl records the agent received per round, against the calls made.
    recorded: Vec<(u64, u64)>,
    /// In-program time per (phase, program name) over all rounds: (ns, runs).
    progs: std::collections::BTreeMap<(usize, String), (u64, u64)>,
}

fn opt(args: &[String], name: &str, default: u64) -> Result<u64> {
    match args.iter().position(|a| a == name) {
        Some(i) => args.get(i + 1).with_context(|| format!("{name} needs a value"))?.parse().context(name.to_string()),
        None => Ok(default),
    }
}

fn agent_config(mode: Mode) -> Config {
    Config {
        attach_mode: mode.attach_mode(),
        driver_entry_probes: mode.probes(),
        ioctl_durations: mode == Mode::FentryTimed,
        dev_dir: "/dev".into(),
        simulated_devices: false,
        driver_version: Some("550.54.15".into()),
        families: Families { cuda: false, ..Families::default() },
        ..Config::default()
    }
}

/// What each program did in each phase of one round: `(phase index, delta)`.
type Progs = Vec<(usize, crate::progstats::ProgDelta)>;

fn run_once(conf: Conf, cpu: usize, calls: u64, warmup: u64) -> Result<([f64; 3], (u64, u64), Progs)> {
    let driver = FakeDriver::builder().gpus(1).start_kmod().context("starting the kernel-module double")?;
    let mut agent = None;
    let mut _floor = None;
    match conf {
        Conf::None => {}
        Conf::Floor(m @ (Mode::Kprobe | Mode::Fentry | Mode::FentryTimed)) => {
            let entry = tracer_agent::probe::driver_entry::detect()
                .map_err(|e| anyhow::anyhow!("the driver's entry points: {e}"))?;
            _floor = Some(if m == Mode::Kprobe {
                crate::floors::attach_kprobes(entry.nvidia.ioctl)?
            } else {
                crate::floors::attach_trampolines("nvidia", entry.nvidia.ioctl)?
            });
        }
        Conf::Floor(Mode::Btf) => _floor = Some(crate::floors::attach(AttachMode::BtfTracepoint, true, &[])?),
        Conf::Agent(m) => {
            let a = agent_run::start(agent_config(m), 0)?;
            if let Some(p) = &a.started.driver_problem {
                bail!("{}: the driver family did not attach: {p}", m.name());
            }
            if a.started.attach_mode != m.attach_mode().as_str() {
                bail!("asked for {}, attached {}", m.name(), a.started.attach_mode);
            }
            agent = Some(a);
        }
    }
    let exe = std::env::current_exe().context("locating the bench binary")?;
    let mut w = Command::new(exe)
        .args(["__worker", "nv-held", &cpu.to_string(), "/dev/nvidiactl", &calls.to_string(), "1"])
        .arg(warmup.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("spawning the worker")?;
    let mut out = BufReader::new(w.stdout.take().context("worker stdout")?);
    let mut stdin = w.stdin.take().context("worker stdin")?;
    let mut line = String::new();
    out.read_line(&mut line)?;
    if line.trim() != "opened" {
        bail!("the worker did not open /dev/nvidiactl: {line:?}");
    }
    // No server: the double answers in the kernel from now on.
    drop(driver);
    writeln!(stdin, "go")?;
    // Run statistics at each phase's start (`ready PHASE`) and after the last.
    let mut edges: Vec<(Option<usize>, crate::progstats::Counts)> = Vec::new();
    let mut lines = Vec::new();
    for l in out.lines() {
        let l = l?;
        if let Some(phase) = l.strip_prefix("ready ") {
            let i = PHASES.iter().position(|p| *p == phase).with_context(|| format!("unknown phase {phase:?}"))?;
            edges.push((Some(i), crate::progstats::read()));
            writeln!(stdin, "go")?;
        } else {
            lines.push(l);
        }
    }
    edges.push((None, crate::progstats::read()));
    drop(stdin);
    let names =
        crate::progstats::names(edges.last().map(|e| e.1.keys().copied().collect::<Vec<_>>()).unwrap_or_default());
    let progs: Progs = edges
        .windows(2)
        .filter_map(|w| Some((w[0].0?, &w[0].1, &w[1].1)))
        .flat_map(|(i, a, b)| crate::progstats::delta(a, b, &names).into_iter().map(move |d| (i, d)))
        .collect();
    if !w.wait()?.success() {
        bail!("the worker failed: {lines:?}");
    }
    let first = |key: &str| -> Result<f64> {
        lines
            .iter()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.split(' ').next()?.parse().ok())
            .with_context(|| format!("worker printed no {key}: {lines:?}"))
    };
    let (g, n, v, total) = (first("getppid")?, first("ioctl_null")?, first("nv")?, first("total")? as u64);
    let recorded = match agent {
        Some(a) => {
            let o = a.finish()?;
            (o.ioctl_events, total)
        }
        None => (0, total),
    };
    Ok(([g, n, v], recorded, progs))
}

pub fn main(args: &[String]) -> Result<()> {
    let runs = opt(args, "--runs", 5)? as usize;
    let calls = opt(args, "--calls", 20_000)?;
    let warmup = (calls / 10).max(100);
    let nproc = sys::online_cpus();
    let cpu = nproc.saturating_sub(1);
    if nproc >= 2 {
        let _ = sys::pin_to(0);
    }
    // The kernel's per-program run times (two clock reads per program run, in every configuration).
    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).context("BPF_ENABLE_STATS")?;
    let confs = [
        Conf::None,
        Conf::Floor(Mode::Btf),
        Conf::Agent(Mode::Btf),
        Conf::Floor(Mode::Kprobe),
        Conf::Agent(Mode::Kprobe),
        Conf::Floor(Mode::Fentry),
        Conf::Agent(Mode::Fentry),
        Conf::Agent(Mode::FentryTimed),
    ];
    let mut rows: Vec<Row> = confs.iter().map(|_| Row::default()).collect();
    for round in 0..runs {
        for (conf, row) in confs.iter().zip(rows.iter_mut()) {
            eprintln!("[bench] driver-entry: round {}/{runs}: {}", round + 1, conf.name());
            let ([g, n, v], rec, progs) = run_once(*conf, cpu, calls, warmup)?;
            for (phase, p) in progs {
                let e = row.progs.entry((phase, p.name)).or_default();
                e.0 += p.time_ns;
                e.1 += p.runs;
            }
            row.getppid.push(g);
            row.null.push(n);
            row.nv.push(v);
            row.recorded.push(rec);
        }
    }
    let med = |v: &[f64]| sys::median(v);
    let base = &rows[0];
    let (bg, bn, bv) = (med(&base.getppid), med(&base.null), med(&base.nv));
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    println!(
        "Driver-entry against btf-tracepoint, kernel {} ({} CPUs, {runs} rounds of {calls} calls per configuration \
         and phase; worker thread CPU ns per call, medians; Δ over no agent; \"empty programs\": the mode's mechanism \
         alone, `noop_btf` on tp_btf sys_enter and sys_exit, `noop_kprobe`/`noop_kretprobe` and \
         `noop_fentry`/`noop_fexit` on the driver's ioctl entry point):\n",
        kernel.trim(),
        nproc
    );
    println!("| configuration | getppid | Δ | ioctl(/dev/null) | Δ | NVIDIA RM_ALLOC | Δ | NVIDIA records / calls |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for (conf, row) in confs.iter().zip(&rows) {
        let (g, n, v) = (med(&row.getppid), med(&row.null), med(&row.nv));
        let rec: (u64, u64) = row.recorded.iter().fold((0, 0), |a, r| (a.0 + r.0, a.1 + r.1));
        let rec = if matches!(conf, Conf::Agent(_)) { format!("{} / {}", rec.0, rec.1) } else { "—".to_string() };
        println!(
            "| {} | {g:.0} | {:+.0} | {n:.0} | {:+.0} | {v:.0} | {:+.0} | {rec} |",
            conf.name(),
            g - bg,
            n - bn,
            v - bv
        );
    }
    // In-program ns per call of a phase: every program's time in that phase over the phase's calls.
    let per_call = (runs as u64 * calls).max(1) as f64;
    println!(
        "\nIn-program time per call of each phase (the kernel's `run_time_ns` of each program over the phase's \
         calls; runs per call in brackets):\n"
    );
    println!("| configuration | program | getppid | ioctl(/dev/null) | NVIDIA RM_ALLOC |");
    println!("|---|---|---:|---:|---:|");
    for (conf, row) in confs.iter().zip(&rows) {
        let names: std::collections::BTreeSet<&String> = row.progs.keys().map(|(_, n)| n).collect();
        for name in names {
            let cell = |phase: usize| match row.progs.get(&(phase, name.clone())) {
                Some((ns, n)) => format!("{:.0} ({:.2})", *ns as f64 / per_call, *n as f64 / per_call),
                None => "—".into(),
            };
            println!("| {} | `{name}` | {} | {} | {} |", conf.name(), cell(0), cell(1), cell(2));
        }
    }
    let in_prog = |i: usize, phase: usize| -> f64 {
        rows[i].progs.iter().filter(|((p, _), _)| *p == phase).map(|(_, (ns, _))| *ns as f64).sum::<f64>() / per_call
    };
    let delta = |i: usize, f: fn(&Row) -> &Vec<f64>, b: f64| med(f(&rows[i])) - b;
    println!(
        "\nWhere an NVIDIA call's Δ goes (ns): the mechanism's floor (its empty programs' Δ), our programs' own run \
         time beyond the empty programs', and the rest (what the programs' work costs outside their run time: \
         cache and TLB effects, the ring buffer's wake-ups, the agent's reader):\n"
    );
    println!("| mode | Δ | floor (empty programs) | our programs' run time over the floor's | rest |");
    println!("|---|---:|---:|---:|---:|");
    let mut over_floor = [0.0f64; 4];
    for (k, (floor, agent)) in [(1usize, 2usize), (3, 4), (5, 6), (5, 7)].into_iter().enumerate() {
        let (d, f) = (delta(agent, |r| &r.nv, bv), delta(floor, |r| &r.nv, bv));
        let progs = in_prog(agent, 2) - in_prog(floor, 2);
        over_floor[k] = d - f;
        println!("| {} | {d:+.0} | {f:+.0} | {progs:+.0} | {:+.0} |", confs[agent].name(), d - f - progs);
    }
    let ratio =
        |a: f64, b: f64| if b.abs() < 1.0 { "n/a (btf Δ < 1 ns)".to_string() } else { format!("{:.2}", a / b) };
    for (k, floor, agent) in [(1usize, 3usize, 4usize), (2, 5, 6), (3, 5, 7)] {
        println!(
            "\nNVIDIA ioctl Δ, {} / btf-tracepoint: {} (above each mechanism's floor: {}; the floors alone: {}); \
             getppid Δ {:+.0} ns vs btf {:+.0} ns; foreign ioctl Δ {:+.0} ns vs btf {:+.0} ns.",
            confs[agent].name(),
            ratio(delta(agent, |r| &r.nv, bv), delta(2, |r| &r.nv, bv)),
            ratio(over_floor[k], over_floor[0]),
            ratio(delta(floor, |r| &r.nv, bv), delta(1, |r| &r.nv, bv)),
            delta(agent, |r| &r.getppid, bg),
            delta(2, |r| &r.getppid, bg),
            delta(agent, |r| &r.null, bn),
            delta(2, |r| &r.null, bn),
        );
    }
    Ok(())
}
