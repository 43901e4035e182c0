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
use tracer_user::config::{AttachMode, Config, Families};

use crate::{agent_run, sys};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Conf {
    None,
    Agent(AttachMode),
}

impl Conf {
    fn name(self) -> &'static str {
        match self {
            Conf::None => "no agent",
            Conf::Agent(m) => m.as_str(),
        }
    }
}

/// One configuration's per-call CPU times (ns), one value per round.
#[derive(Default)]
struct Row {
    getppid: Vec<f64>,
    null: Vec<f64>,
    nv: Vec<f64>,
    /// NVIDIA ioctl records the agent received per round, against the calls made.
    recorded: Vec<(u64, u64)>,
    /// In-program time per program name over all rounds: (ns, runs).
    progs: std::collections::BTreeMap<String, (u64, u64)>,
}

fn opt(args: &[String], name: &str, default: u64) -> Result<u64> {
    match args.iter().position(|a| a == name) {
        Some(i) => args.get(i + 1).with_context(|| format!("{name} needs a value"))?.parse().context(name.to_string()),
        None => Ok(default),
    }
}

fn agent_config(mode: AttachMode) -> Config {
    Config {
        attach_mode: mode,
        dev_dir: "/dev".into(),
        simulated_devices: false,
        driver_version: Some("550.54.15".into()),
        families: Families { cuda: false, ..Families::default() },
        ..Config::default()
    }
}

/// One round of one configuration: `(getppid, null, nv)` ns per call and the NVIDIA records.
type Progs = Vec<crate::progstats::ProgDelta>;

fn run_once(conf: Conf, cpu: usize, calls: u64, warmup: u64) -> Result<([f64; 3], (u64, u64), Progs)> {
    let driver = FakeDriver::builder().gpus(1).start_kmod().context("starting the kernel-module double")?;
    let agent = match conf {
        Conf::None => None,
        Conf::Agent(m) => {
            let a = agent_run::start(agent_config(m), 0)?;
            if let Some(p) = &a.started.driver_problem {
                bail!("{}: the driver family did not attach: {p}", m.as_str());
            }
            if a.started.attach_mode != m.as_str() {
                bail!("asked for {}, attached {}", m.as_str(), a.started.attach_mode);
            }
            Some(a)
        }
    };
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
    let mut line = String::new();
    out.read_line(&mut line)?;
    if line.trim() != "opened" {
        bail!("the worker did not open /dev/nvidiactl: {line:?}");
    }
    // No server: the double answers in the kernel from now on.
    drop(driver);
    let before = crate::progstats::read();
    writeln!(w.stdin.take().context("worker stdin")?, "go")?;
    let lines: Vec<String> = out.lines().map_while(Result::ok).collect();
    let after = crate::progstats::read();
    let names = crate::progstats::names(after.keys().copied());
    let progs = crate::progstats::delta(&before, &after, &names);
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
    // The kernel's per-program run times (two clock reads per program run, in both agent modes).
    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).context("BPF_ENABLE_STATS")?;
    let confs = [Conf::None, Conf::Agent(AttachMode::BtfTracepoint), Conf::Agent(AttachMode::DriverEntry)];
    let mut rows: Vec<Row> = confs.iter().map(|_| Row::default()).collect();
    for round in 0..runs {
        for (conf, row) in confs.iter().zip(rows.iter_mut()) {
            eprintln!("[bench] driver-entry: round {}/{runs}: {}", round + 1, conf.name());
            let ([g, n, v], rec, progs) = run_once(*conf, cpu, calls, warmup)?;
            for p in progs {
                let e = row.progs.entry(p.name).or_default();
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
        "Driver-entry against btf-tracepoint, kernel {} ({} CPUs, {runs} rounds of {calls} calls per configuration; \
         worker thread CPU ns per call, medians; Δ over no agent):\n",
        kernel.trim(),
        nproc
    );
    println!("| configuration | getppid | Δ | ioctl(/dev/null) | Δ | NVIDIA RM_ALLOC | Δ | NVIDIA records / calls |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for (conf, row) in confs.iter().zip(&rows) {
        let (g, n, v) = (med(&row.getppid), med(&row.null), med(&row.nv));
        let rec: (u64, u64) = row.recorded.iter().fold((0, 0), |a, r| (a.0 + r.0, a.1 + r.1));
        let rec = if *conf == Conf::None { "—".to_string() } else { format!("{} / {}", rec.0, rec.1) };
        println!(
            "| {} | {g:.0} | {:+.0} | {n:.0} | {:+.0} | {v:.0} | {:+.0} | {rec} |",
            conf.name(),
            g - bg,
            n - bn,
            v - bv
        );
    }
    println!("\nIn-program time (the kernel's `run_time_ns / run_cnt`, every call of the timed windows):\n");
    println!("| configuration | program | runs | ns per run |");
    println!("|---|---|---:|---:|");
    for (conf, row) in confs.iter().zip(&rows) {
        for (name, (ns, runs)) in &row.progs {
            println!("| {} | `{name}` | {runs} | {:.0} |", conf.name(), *ns as f64 / (*runs).max(1) as f64);
        }
    }
    let d = |i: usize, f: fn(&Row) -> &Vec<f64>, b: f64| med(f(&rows[i])) - b;
    let ratio =
        |a: f64, b: f64| if b.abs() < 1.0 { "n/a (btf Δ < 1 ns)".to_string() } else { format!("{:.2}", a / b) };
    println!(
        "\nNVIDIA ioctl Δ, driver-entry / btf-tracepoint: {}; getppid Δ driver-entry {:+.0} ns vs btf {:+.0} ns; \
         foreign ioctl Δ driver-entry {:+.0} ns vs btf {:+.0} ns.",
        ratio(d(2, |r| &r.nv, bv), d(1, |r| &r.nv, bv)),
        d(2, |r| &r.getppid, bg),
        d(1, |r| &r.getppid, bg),
        d(2, |r| &r.null, bn),
        d(1, |r| &r.null, bn),
    );
    Ok(())
}
