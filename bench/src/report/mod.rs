//! The measurements of one run, rendered as the Markdown report (stdout and `docs/benchmarks.md`).
use std::{fmt::Write as _, time::Duration};

use tracer_core::config::AttachMode;

use crate::{
    Ctx,
    agent_run::Outcome,
    bpftrace,
    cuda::{CudaMeasured, CudaProbe, CudaSection},
    offline, progstats, sys, worker,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SysKind {
    None,
    FloorEnter,
    FloorBoth,
    Agent,
}

/// ns per call, by the calling thread's CPU time and by the wall clock.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub cpu: f64,
    pub wall: f64,
}

pub struct SysRow {
    pub kind: SysKind,
    pub mode: Option<AttachMode>,
    /// CPU-time ns/call, one per round.
    pub ioctl: Result<Vec<f64>, String>,
    pub getppid: Result<Vec<f64>, String>,
    /// Wall-clock ns/call, one per round.
    pub ioctl_wall: Vec<f64>,
    pub getppid_wall: Vec<f64>,
    /// Per round: were other tracers loaded around it?
    pub dirty: Vec<bool>,
    /// Rounds left out because other tracers were loaded (only when clean rounds remain).
    pub dropped_rounds: usize,
}

/// Keep the entries of `v` whose `dirty` flag is false.
fn keep_clean(v: &mut Vec<f64>, dirty: &[bool]) {
    let mut i = 0;
    v.retain(|_| {
        let keep = !dirty.get(i).copied().unwrap_or(false);
        i += 1;
        keep
    });
}

impl SysRow {
    pub fn new(kind: SysKind, mode: Option<AttachMode>) -> Self {
        Self {
            kind,
            mode,
            ioctl: Ok(vec![]),
            getppid: Ok(vec![]),
            ioctl_wall: vec![],
            getppid_wall: vec![],
            dirty: vec![],
            dropped_rounds: 0,
        }
    }

    /// Leave out rounds measured while other tracers were loaded, if any clean round remains.
    pub fn drop_dirty_rounds(&mut self) {
        let n = self.dirty.iter().filter(|d| **d).count();
        if n == 0 || n == self.dirty.len() {
            return;
        }
        let d = self.dirty.clone();
        for v in [&mut self.ioctl_wall, &mut self.getppid_wall] {
            keep_clean(v, &d);
        }
        if let Ok(v) = &mut self.ioctl {
            keep_clean(v, &d);
        }
        if let Ok(v) = &mut self.getppid {
            keep_clean(v, &d);
        }
        self.dropped_rounds = n;
    }

    /// Rounds measured while other tracers were loaded and kept (all rounds were).
    pub fn dirty_kept(&self) -> usize {
        if self.dropped_rounds == 0 { self.dirty.iter().filter(|d| **d).count() } else { 0 }
    }
}

pub struct SyscallSection {
    pub rows: Vec<SysRow>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NvKind {
    None,
    Agent(AttachMode),
    Bpftrace,
}

#[derive(Clone, Debug, Default)]
pub struct NvMeasured {
    /// CPU-time ns/call, one per round.
    pub runs: Vec<f64>,
    /// Wall-clock ns/call, one per round.
    pub wall: Vec<f64>,
    /// Calls the workers made over all rounds (warm-up included): what every counter must show.
    pub total: u64,
    /// One agent session per round.
    pub sessions: Vec<Outcome>,
    pub dirty: Vec<bool>,
    pub dropped_rounds: usize,
    pub bpftrace_count: Option<u64>,
    /// Rounds that failed, and why.
    pub failures: Vec<String>,
    pub memlock: u64,
    pub rss_before_kb: u64,
    pub rss_before_parts: (u64, u64, u64),
}

impl NvMeasured {
    pub fn push(&mut self, t: Timing, dirty: bool) {
        self.runs.push(t.cpu);
        self.wall.push(t.wall);
        self.dirty.push(dirty);
    }

    /// As [`SysRow::drop_dirty_rounds`].
    pub fn drop_dirty_rounds(&mut self) {
        let n = self.dirty.iter().filter(|d| **d).count();
        if n == 0 || n == self.dirty.len() {
            return;
        }
        let d = self.dirty.clone();
        keep_clean(&mut self.runs, &d);
        keep_clean(&mut self.wall, &d);
        self.dropped_rounds = n;
    }

    pub fn dirty_kept(&self) -> usize {
        if self.dropped_rounds == 0 { self.dirty.iter().filter(|d| **d).count() } else { 0 }
    }
}

pub struct NvRow {
    pub kind: NvKind,
    pub result: Result<NvMeasured, String>,
}

pub struct NvSection {
    pub rows: Vec<NvRow>,
    pub stats: Result<Vec<StatsRow>, String>,
}

/// One window of section 2b.
pub struct StatsRow {
    pub mode: AttachMode,
    /// Worker variant: `full`, `no-nested`, `bare`.
    pub variant: String,
    /// The empty programs instead of the agent.
    pub floor: bool,
    /// NVIDIA calls made in the window.
    pub calls: u64,
    pub progs: Vec<progstats::ProgDelta>,
}

pub struct FloodMeasured {
    pub mode: String,
    pub elapsed_ns: u64,
    pub calls: u64,
    pub producers: usize,
    pub agent: Outcome,
}

pub struct FloodRow {
    pub ring_bytes: u32,
    pub spin_ns: u64,
    pub result: Result<FloodMeasured, String>,
}

pub struct FloodSection {
    pub rows: Vec<FloodRow>,
    pub producer_cpus: Vec<usize>,
}

pub struct OfflineSection {
    pub result: Result<(String, offline::Throughput), String>,
}

pub struct IdleMeasured {
    pub mode: String,
    pub rss_started_kb: u64,
    pub rss_started_parts: (u64, u64, u64),
    pub rss_idle_kb: u64,
    pub memlock: u64,
    pub outcome: Outcome,
}

pub struct IdleSection {
    pub rss_baseline_kb: u64,
    pub rss_baseline_parts: (u64, u64, u64),
    pub idle: Result<IdleMeasured, String>,
    /// The btf-tracepoint agent of section 2, under load.
    pub loaded: Option<NvMeasured>,
}

pub struct Report<'a> {
    pub ctx: &'a Ctx,
    pub notes: Vec<String>,
    pub syscalls: SyscallSection,
    pub nv: NvSection,
    pub flood: FloodSection,
    pub offline: OfflineSection,
    pub idle: IdleSection,
    pub cuda: CudaSection,
    pub attribution: crate::attribution::AttributionSection,
    pub nvml: crate::nvml::NvmlSection,
    pub api: crate::api::ApiSection,
    pub exporters: crate::exporters::ExportersSection,
    pub cost: crate::cost::CostSection,
    pub scan: crate::scan::ScanSection,
    pub profile: crate::profile::ProfileSection,
    pub session: crate::session::SessionSection,
    pub hwm_before_offline_kb: u64,
    /// 1-minute load average at the start and the end.
    pub load: (f64, f64),
    /// Other tracers (eBPF tracing programs not ours) seen loaded during the bench.
    pub foreign: Vec<String>,
    pub elapsed: Duration,
}

/// The goals the issue sets, as reference lines (nothing here fails on them).
const GOAL_FLOOR_NS: f64 = 20.0;
const GOAL_BPFTRACE_RATIO: f64 = 1.5;
const GOAL_INGEST_PER_S: f64 = 1e6;
/// Section 5: the agent's launch probe at least this many times cheaper than one at the symbol
/// address (real libcuda, endbr64 variant), and no more expensive than bpftrace's anywhere.
const GOAL_CUDA_VS_SYMBOL: f64 = 10.0;

fn ns(v: f64) -> String {
    if v.abs() >= 100.0 { format!("{v:.0}") } else { format!("{v:.1}") }
}

fn signed(v: f64) -> String {
    if v >= 0.0 { format!("+{}", ns(v)) } else { format!("−{}", ns(-v)) }
}

fn cell(r: &Result<Vec<f64>, String>) -> String {
    match r {
        Ok(v) => format!("{} ({}–{})", ns(sys::median(v)), ns(sys::min(v)), ns(sys::max(v))),
        Err(e) => format!("not measured: {}", one_line(e)),
    }
}

pub(crate) fn one_line(s: &str) -> String {
    let s = s.replace('\n', " ").replace('|', "\\|");
    if s.chars().count() > 160 { format!("{}…", s.chars().take(160).collect::<String>()) } else { s }
}

fn mib(kb: u64) -> String {
    format!("{:.1} MiB", kb as f64 / 1024.0)
}

fn rate(per_s: f64) -> String {
    if per_s >= 1e6 { format!("{:.2} M/s", per_s / 1e6) } else { format!("{:.0} k/s", per_s / 1e3) }
}

fn kind_label(k: SysKind) -> &'static str {
    match k {
        SysKind::None => "no probe",
        SysKind::FloorEnter => "empty program, entry",
        SysKind::FloorBoth => "empty program, entry + exit",
        SysKind::Agent => "**agent probes**",
    }
}

fn mode_label(m: Option<AttachMode>) -> &'static str {
    m.map_or("", |m| m.as_str())
}

type Which = fn(&SysRow) -> &Result<Vec<f64>, String>;

fn ioctl_of(r: &SysRow) -> &Result<Vec<f64>, String> {
    &r.ioctl
}
fn getppid_of(r: &SysRow) -> &Result<Vec<f64>, String> {
    &r.getppid
}

impl SyscallSection {
    fn baseline_runs(&self, which: Which) -> Option<&Vec<f64>> {
        self.rows
            .iter()
            .find(|r| r.kind == SysKind::None)
            .and_then(|r| which(r).as_ref().ok())
            .filter(|v| !v.is_empty())
    }

    fn baseline(&self, which: Which) -> Option<f64> {
        self.baseline_runs(which).map(|v| sys::median(v))
    }

    fn get(&self, kind: SysKind, mode: AttachMode, which: Which) -> Option<f64> {
        self.rows
            .iter()
            .find(|r| r.kind == kind && r.mode == Some(mode))
            .and_then(|r| which(r).as_ref().ok())
            .filter(|v| !v.is_empty())
            .map(|v| sys::median(v))
    }
}

impl NvSection {
    fn median(&self, kind: NvKind) -> Option<f64> {
        self.rows
            .iter()
            .find(|r| r.kind == kind)
            .and_then(|r| r.result.as_ref().ok())
            .filter(|m| !m.runs.is_empty())
            .map(|m| sys::median(&m.runs))
    }
}

impl Report<'_> {
    pub fn render(&self) -> String {
        let mut s = String::new();
        let c = self.ctx;
        let m = &c.machine;
        let o = &c.opts;
        let _ = writeln!(s, "# Benchmarks\n");
        let _ = writeln!(
            s,
            "Generated by `cargo xtask bench` (`cargo run --release -p gpu-tracer-bench -- --write docs/benchmarks.md`). \
             Every number comes from one run on the machine below and is reported against a baseline measured in the \
             same run; nothing here is a pass/fail threshold. Rerun it on the machine you care about.\n"
        );
        let _ = writeln!(s, "## Machine\n");
        let _ = writeln!(s, "| | |\n|---|---|");
        let _ = writeln!(s, "| date | {} |", m.date_utc);
        let _ = writeln!(s, "| kernel | {} |", m.kernel);
        let _ = writeln!(s, "| CPU | {} |", m.cpu_model);
        let _ = writeln!(s, "| nproc | {} |", m.nproc);
        let _ = writeln!(
            s,
            "| load average (1 min) | {:.2} at start, {:.2} at end (the bench itself keeps about one CPU busy){} |",
            self.load.0,
            self.load.1,
            if self.load.0 > 0.5 * m.nproc as f64 { " — other work was running: expect noisy numbers" } else { "" }
        );
        let _ = writeln!(
            s,
            "| pinning | measured calls on CPU {}; bench process and agent consumer thread on {} |",
            c.worker_cpu,
            c.agent_cpu.map_or("any CPU".to_string(), |c| format!("CPU {c}"))
        );
        let _ = writeln!(s, "| bpftrace | {} |", m.bpftrace.as_deref().unwrap_or("not installed"));
        let _ = writeln!(
            s,
            "| other tracers seen | {} |",
            if self.foreign.is_empty() {
                "none (no eBPF tracing program but the bench's own was loaded around any measurement)".to_string()
            } else {
                format!(
                    "{} — rounds measured while one was loaded are left out where clean rounds remain (column \"rounds\")",
                    one_line(&self.foreign.join(", "))
                )
            }
        );
        let _ = writeln!(
            s,
            "| parameters | {} rounds; per round {} calls of each syscall (section 1) and {} NVIDIA ioctls (section 2), each after {} warm-up calls; {} calls per producer (3b); {} s idle; section 5: {} rounds of about {} ms of launches per configuration, {} launches per thread in 5b{} |",
            o.runs,
            o.calls,
            o.nv_calls,
            c.warmup,
            o.flood_calls,
            o.idle_secs,
            self.cuda.rounds,
            self.cuda.target_ms,
            self.cuda.per_thread_calls,
            if o.quick { "; --quick" } else { "" }
        );
        let _ = writeln!(s, "| bench wall time | {:.0} s |", self.elapsed.as_secs_f64());
        for n in &self.notes {
            let _ = writeln!(s, "\n> note: {n}");
        }
        s.push('\n');
        self.render_syscalls(&mut s);
        self.render_nv(&mut s);
        self.render_ingest(&mut s);
        self.render_resources(&mut s);
        self.render_cuda(&mut s);
        self.attribution.render(&mut s);
        self.nvml.render(&mut s);
        self.api.render(&mut s);
        self.exporters.render(&mut s);
        self.cost.render(&mut s);
        self.scan.render(&mut s);
        self.profile.render(&mut s);
        self.session.render(&mut s);
        self.render_reading(&mut s);
        s
    }

    fn render_syscalls(&self, s: &mut String) {
        let sec = &self.syscalls;
        let o = &self.ctx.opts;
        let _ = writeln!(s, "## 1. Syscalls that are not NVIDIA ioctls\n");
        let _ = writeln!(
            s,
            "**Method.** A child process pinned to CPU {} makes {} calls of `ioctl(fd of /dev/null, TCGETS)` (a foreign \
             ioctl from a process that never opened an NVIDIA node: the driver family's handlers stop at its \
             `TRACKED_TGIDS` byte; `-ENOTTY`), then {} of \
             `syscall(SYS_getppid)` (a syscall the driver family does not handle). ns/call is the child thread's CPU time \
             (`CLOCK_THREAD_CPUTIME_ID`, which includes the kernel's syscall and probe work but not time the thread spent \
             waiting for the CPU) divided by the calls; wall-clock medians follow the table. Configurations: no \
             probe; for each attach mode its empty program (`noop_tp` on `syscalls:sys_enter_<syscall>`, `noop_raw` on raw \
             `sys_enter`, `noop_btf` on tp_btf `sys_enter`) at entry only, then at entry and exit (where the agent attaches); \
             then the agent's real probes (`Probes::load` with that `attach_mode`, driver and lifecycle families, default \
             configuration; the cuda family is section 5's), loaded for the whole run. Every configuration is attached, measured once and detached in each of \
             {} rounds (so bursts of other load spread over all of them); the cell is the median over rounds (min–max).\n",
            self.ctx.worker_cpu, o.calls, o.calls, o.runs
        );
        let _ = writeln!(
            s,
            "**Goal:** the agent within {GOAL_FLOOR_NS:.0} ns of its mechanism's floor: column \"agent − floor\", against \
             the entry + exit floor of the same mode.\n"
        );
        let bi = sec.baseline(ioctl_of);
        let bg = sec.baseline(getppid_of);
        let _ = writeln!(
            s,
            "| probe | mode | `ioctl(/dev/null, TCGETS)` ns/call | Δ vs no probe | agent − floor | `getppid()` ns/call | Δ vs no probe | agent − floor | rounds |"
        );
        let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|---:|---|");
        for r in &sec.rows {
            let label = kind_label(r.kind);
            let delta = |v: &Result<Vec<f64>, String>, base: Option<f64>| match (v, base) {
                (Ok(v), Some(b)) if r.kind != SysKind::None && !v.is_empty() => signed(sys::median(v) - b),
                _ => String::new(),
            };
            let over = |v: &Result<Vec<f64>, String>, which: Which| match (
                r.kind,
                v,
                r.mode.and_then(|m| sec.get(SysKind::FloorBoth, m, which)),
            ) {
                (SysKind::Agent, Ok(v), Some(f)) if !v.is_empty() => format!("**{}**", signed(sys::median(v) - f)),
                _ => String::new(),
            };
            let mut gp_cell = cell(&r.getppid);
            if r.kind == SysKind::Agent && r.mode == Some(AttachMode::SyscallTracepoint) {
                gp_cell.push_str(" ¹");
            }
            let _ = writeln!(
                s,
                "| {label} | {} | {} | {} | {} | {} | {} | {} | {} |",
                mode_label(r.mode),
                cell(&r.ioctl),
                delta(&r.ioctl, bi),
                over(&r.ioctl, ioctl_of),
                gp_cell,
                delta(&r.getppid, bg),
                over(&r.getppid, getppid_of),
                rounds_cell(r.dirty.len(), r.dropped_rounds, r.dirty_kept())
            );
        }
        let drift = |which: Which| match sec.baseline_runs(which) {
            Some(v) if v.len() >= 2 => signed(v[v.len() - 1] - v[0]),
            _ => "n/a".to_string(),
        };
        let _ = writeln!(
            s,
            "\nNo-probe baseline drift (CPU time) from the first round to the last: ioctl {} ns, getppid {} ns.\n",
            drift(ioctl_of),
            drift(getppid_of)
        );
        let wall = |v: &Vec<f64>| if v.is_empty() { String::new() } else { ns(sys::median(v)) };
        let _ = writeln!(s, "<details><summary>Wall-clock ns/call (medians)</summary>\n");
        let _ = writeln!(s, "| probe | mode | ioctl | getppid |\n|---|---|---:|---:|");
        for r in &sec.rows {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} |",
                kind_label(r.kind),
                mode_label(r.mode),
                wall(&r.ioctl_wall),
                wall(&r.getppid_wall)
            );
        }
        let _ = writeln!(s, "\n</details>\n");
        let _ = writeln!(
            s,
            "¹ In the syscall-tracepoint mode the agent is not attached to `getppid` at all: what `getppid` pays is the \
             syscall slow path that attaching *any* syscall tracepoint turns on for every syscall of every task \
             (`SYSCALL_WORK_SYSCALL_TRACEPOINT`), and the tracepoint's per-syscall check. Its floor rows are the empty \
             program on `getppid`'s own tracepoints, so here \"agent − floor\" is the difference between not being attached \
             and running an empty program.\n"
        );
    }

    fn render_nv(&self, s: &mut String) {
        let sec = &self.nv;
        let o = &self.ctx.opts;
        let _ = writeln!(s, "## 2. Cost per NVIDIA ioctl (RM_ALLOC, full capture path)\n");
        let _ = writeln!(
            s,
            "**Method.** A regular file named `nvidiactl` in a tmpfs directory (`{}`) stands in for the device; the agent's \
             `dev_dir` points there with `simulated_devices` on, so the tracer recognises the fd by its path and its \
             device and inode (checked once, at open) and every ioctl on it takes the full capture \
             path, while the file system answers `-ENOTTY` at once and keeps the driver's own cost out of the numbers. A child \
             pinned to CPU {} opens it (after the probes are attached) and makes {} `ioctl(fd, 0x{:08X}, &nvos64)` calls (ns/call \
             by its CPU time, as in section 1; wall clock alongside): a \
             48-byte `NVOS64_PARAMETERS` with `hClass = 0x40` and `pAllocParms` pointing at a valid 128-byte \
             `NV_MEMORY_ALLOCATION_PARAMS`, so the kernel side copies the main window and follows the nested pointer (driver \
             layouts of 550.54.15: 128 nested bytes). The agent is a real `tracer_agent::pipeline::Agent` draining the ring \
             buffer in its own thread on the other CPU, decoding and applying every record as in production (driver and \
             lifecycle families; the cuda family is section 5's). bpftrace runs \
             `{}` (started, awaited until attached, then measured). {} rounds; in each, every configuration is started, \
             measured once and stopped; counters are read after each session's last drain and summed over rounds. \"seen\" is \
             the kernel's count for the ioctl probe (bpftrace: its map total).\n",
            self.ctx.fake_dir.display(),
            self.ctx.worker_cpu,
            o.nv_calls,
            worker::RM_ALLOC_NVOS64,
            bpftrace::PROGRAM,
            o.runs
        );
        let _ = writeln!(s, "**Goal:** the agent's Δ within {GOAL_BPFTRACE_RATIO}× bpftrace's Δ.\n");
        let base = sec.median(NvKind::None);
        let bt = sec.median(NvKind::Bpftrace).zip(base).map(|(b, n)| b - n);
        let _ = writeln!(
            s,
            "| probe | ns/call (CPU) | Δ vs no probe | Δ ÷ bpftrace's Δ | wall ns/call | rounds | calls made | seen (kernel) | ioctl events decoded | dropped | decode errors | seen == received + dropped |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|");
        for r in &sec.rows {
            let label = match r.kind {
                NvKind::None => "no probe".to_string(),
                NvKind::Agent(m) => format!("**agent**, {}", m.as_str()),
                NvKind::Bpftrace => "bpftrace (syscall tracepoint, count per cgroup)".to_string(),
            };
            match &r.result {
                Err(e) => {
                    let _ = writeln!(s, "| {label} | not measured: {} | | | | | | | | | | |", one_line(e));
                }
                Ok(mm) if mm.runs.is_empty() => {
                    let _ = writeln!(s, "| {label} | not measured | | | | | | | | | | |");
                }
                Ok(mm) => {
                    let med = sys::median(&mm.runs);
                    let d = base.filter(|_| r.kind != NvKind::None).map(|b| med - b);
                    let ratio = match (d, bt) {
                        (Some(d), Some(b)) if b > 0.0 => format!("{:.2}×", d / b),
                        _ => String::new(),
                    };
                    let (seen, decoded, dropped, errors, ident) = if !mm.sessions.is_empty() {
                        let sum = |f: fn(&Outcome) -> u64| mm.sessions.iter().map(f).sum::<u64>();
                        (
                            check(sum(|o| o.ioctl.seen), mm.total),
                            check(sum(|o| o.ioctl_events), mm.total),
                            sum(|o| o.ioctl.dropped()).to_string(),
                            sum(|o| o.decode_errors).to_string(),
                            identity_all(&mm.sessions),
                        )
                    } else if let Some(n) = mm.bpftrace_count {
                        let seen = if n > mm.total {
                            // bpftrace counts the command system-wide: other processes' RM_ALLOCs too.
                            format!("{n} ({} from other processes)", n - mm.total)
                        } else {
                            check(n, mm.total)
                        };
                        (seen, String::new(), String::new(), String::new(), String::new())
                    } else {
                        Default::default()
                    };
                    let _ = writeln!(
                        s,
                        "| {label} | {} ({}–{}) | {} | {ratio} | {} | {} | {} | {seen} | {decoded} | {dropped} | {errors} | {ident} |",
                        ns(med),
                        ns(sys::min(&mm.runs)),
                        ns(sys::max(&mm.runs)),
                        d.map(signed).unwrap_or_default(),
                        ns(sys::median(&mm.wall)),
                        failed_rounds(rounds_cell(mm.dirty.len(), mm.dropped_rounds, mm.dirty_kept()), &mm.failures),
                        mm.total
                    );
                }
            }
        }
        s.push('\n');
        let _ = writeln!(s, "### 2b. Time inside the agent's programs\n");
        let _ = writeln!(
            s,
            "**Method.** The kernel's own per-program statistics (`BPF_ENABLE_STATS`, `run_time_ns`/`run_cnt` from \
             `/proc/self/fdinfo`), read before and after one more agent session with {} calls (plus the warm-up): the \
             RM_ALLOC of section 2 in each mode; then, in the btf-tracepoint mode, the same call with a class that has no \
             nested parameters, and an escape with neither a capture plan nor a size (`0x{:08X}`: the record is written, \
             nothing is copied); last, the empty programs at entry and exit as the reference. Statistics are on only for this \
             part and add two clock reads to every program run (see the reference). The window also counts every other \
             syscall passing through the programs meanwhile (the whole machine's, in the raw and btf modes), so \"ns per \
             call\" is an upper bound; subtracting rows gives the cost of each step.\n",
            o.nv_calls,
            worker::BARE_CMD
        );
        match &sec.stats {
            Err(e) => {
                let _ = writeln!(s, "not measured: {}\n", one_line(e));
            }
            Ok(v) => {
                let _ = writeln!(s, "| mode | calls | program | runs | ns/run | ns per call |");
                let _ = writeln!(s, "|---|---|---|---:|---:|---:|");
                for r in v {
                    let what = match (r.floor, r.variant.as_str()) {
                        (true, _) => "RM_ALLOC, **empty programs** (reference)",
                        (false, "full") => "RM_ALLOC, memory class: main window + nested 128 B",
                        (false, "no-nested") => "RM_ALLOC, class without nested parameters: main window only",
                        (false, "bare") => "escape without capture plan, size 0: nothing copied",
                        _ => r.variant.as_str(),
                    };
                    for p in r
                        .progs
                        .iter()
                        .filter(|p| p.time_ns > 0 && (p.name.starts_with("sys_") || p.name.starts_with("noop")))
                    {
                        let _ = writeln!(
                            s,
                            "| {} | {what} | `{}` | {} | {} | {} |",
                            r.mode.as_str(),
                            p.name,
                            p.runs,
                            ns(p.time_ns as f64 / p.runs.max(1) as f64),
                            ns(p.time_ns as f64 / r.calls.max(1) as f64)
                        );
                    }
                }
                s.push('\n');
            }
        }
    }

    fn render_ingest(&self, s: &mut String) {
        let _ = writeln!(s, "## 3. Ring-buffer ingest\n");
        let _ = writeln!(s, "### 3a. Offline: decode and state apply on one core\n");
        let _ = writeln!(
            s,
            "**Method.** A buffer of records built with `tracer_core::decode::encode` (checked to decode back to the same \
             events), laid out 8-byte aligned as in the ring buffer, replayed 5 times on CPU {}; median pass. \"decode\" is \
             `decode::decode` alone; \"decode + state apply\" adds `TracerState::apply` (the ledger), as the pipeline does per \
             record before enrichment and export. **Goal:** ≥ 1 M events/s.\n",
            self.ctx.agent_cpu.map_or("any".to_string(), |c| c.to_string())
        );
        match &self.offline.result {
            Err(e) => {
                let _ = writeln!(s, "not measured: {}\n", one_line(e));
            }
            Ok((mix, t)) => {
                let _ = writeln!(s, "Buffer: {mix}.\n");
                let _ = writeln!(s, "| stage | records per pass | events/s | ns/event | × goal (1 M/s) |");
                let _ = writeln!(s, "|---|---:|---:|---:|---:|");
                for (name, r) in [("decode", t.decode_per_s), ("decode + state apply", t.apply_per_s)] {
                    let _ = writeln!(
                        s,
                        "| {name} | {} | {} | {} | {:.1}× |",
                        t.records,
                        rate(r),
                        ns(1e9 / r),
                        r / GOAL_INGEST_PER_S
                    );
                }
                let (got, want, live) = t.ledger;
                let _ = writeln!(
                    s,
                    "\nLedger check after the passes: {got} allocations counted ({}), {live} live at the end{}.",
                    if got == want { "as built".to_string() } else { format!("**expected {want}**") },
                    if live == 0 { "" } else { " (**expected 0**)" }
                );
                if t.decode_errors > 0 {
                    let _ = writeln!(s, "\n{} records failed to decode (should be 0).", t.decode_errors);
                }
                s.push('\n');
            }
        }
        let f = &self.flood;
        let first = f.rows.iter().find_map(|r| r.result.as_ref().ok());
        let _ = writeln!(s, "### 3b. Live: small ring buffer, slowed consumer, loss and accounting\n");
        let _ = writeln!(
            s,
            "**Method.** The agent ({} mode) with `ring_buffer_bytes` as listed (an ioctl record takes {} bytes in the \
             ring, header included); its sink busy-waits the listed time per event, as a slow exporter would. A child runs {} \
             producer thread(s) (on CPU {}) that each make {} RM_ALLOC ioctls on the fake `nvidiactl` as fast as they can. \
             After the producers finish, the agent drains what is left and the accounting is read: \"seen\" and \"dropped\" \
             are the kernel's counters over all probes, \"received\" what user space took out of the ring buffer (the open and \
             exit records included). Loss is dropped ÷ seen; consumer capacity is 1 s ÷ the agent thread's CPU time per \
             received record.\n",
            first.map_or("auto", |m| m.mode.as_str()),
            RECORD_IN_RING,
            first.map_or(f.producer_cpus.len(), |m| m.producers),
            f.producer_cpus.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(", "),
            self.ctx.opts.flood_calls
        );
        let _ = writeln!(
            s,
            "| ring (records) | consumer +ns/event | calls | producer rate | consumer capacity | seen | received | dropped | loss | seen == received + dropped |"
        );
        let _ = writeln!(s, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
        for r in &f.rows {
            let ring = format!("{} ({})", ring_label(r.ring_bytes), r.ring_bytes as usize / RECORD_IN_RING);
            match &r.result {
                Err(e) => {
                    let _ = writeln!(s, "| {ring} | {} | not measured: {} | | | | | | | |", r.spin_ns, one_line(e));
                }
                Ok(m) => {
                    let a = &m.agent.accounting;
                    let loss = if a.seen > 0 { 100.0 * a.dropped as f64 / a.seen as f64 } else { 0.0 };
                    let cap = if a.received > 0 && m.agent.cpu_ns > 0 {
                        rate(a.received as f64 * 1e9 / m.agent.cpu_ns as f64)
                    } else {
                        "n/a".into()
                    };
                    let _ = writeln!(
                        s,
                        "| {ring} | {} | {} | {} | {cap} | {} | {} | {} | {loss:.1}% | {} |",
                        r.spin_ns,
                        m.calls,
                        rate(m.calls as f64 * 1e9 / m.elapsed_ns.max(1) as f64),
                        a.seen,
                        a.received,
                        a.dropped,
                        identity(&m.agent)
                    );
                }
            }
        }
        s.push('\n');
    }

    fn render_resources(&self, s: &mut String) {
        let i = &self.idle;
        let _ = writeln!(s, "## 4. Agent memory and CPU\n");
        let (a0, f0, _) = i.rss_baseline_parts;
        let _ = writeln!(
            s,
            "**Method.** The agent runs inside the bench process, so its memory is the bench's `VmRSS` after the agent \
             started minus just before (bench process before any agent: {} = {} anonymous + {} file-backed). BPF map memory \
             is the sum of `memlock` over the process's map fds (`/proc/self/fdinfo`): kernel memory. The file-backed part \
             of RSS is mostly the ring buffer's data area mapped into the agent (twice, back to back, so a record that wraps \
             reads contiguously: 16 MiB for the 8 MiB ring): the same kernel pages the map memory counts, not more memory; \
             the agent's own heap is the anonymous part. CPU is the \
             agent thread's own CPU time (`CLOCK_THREAD_CPUTIME_ID`: its tokio runtime, ring-buffer polling, decode, state and \
             sink) from attach to the last drain. Idle: production defaults (`/dev`, auto mode, 8 MiB ring, 10 ms drain \
             timer, every probe family: the cuda family on the libcuda found in the usual places). Under load: the btf-tracepoint sessions of section 2 while the child made its calls.\n",
            mib(i.rss_baseline_kb),
            mib(a0),
            mib(f0)
        );
        let _ = writeln!(
            s,
            "| situation | VmRSS | Δ VmRSS vs before | BPF map memory | agent CPU | % of one CPU | CPU per record |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|");
        match &i.idle {
            Err(e) => {
                let _ = writeln!(s, "| idle | not measured: {} | | | | | |", one_line(e));
            }
            Ok(m) => {
                let o = &m.outcome;
                let (a1, f1, _) = m.rss_started_parts;
                let _ = writeln!(
                    s,
                    "| just started ({}) | {} | {} (anon {}, file {}) | {} | | | |",
                    m.mode,
                    mib(m.rss_started_kb),
                    signed_mib(m.rss_started_kb, i.rss_baseline_kb),
                    signed_mib(a1, a0),
                    signed_mib(f1, f0),
                    mib(m.memlock / 1024)
                );
                let _ = writeln!(
                    s,
                    "| idle {} s | {} | {} | {} | {:.1} ms | {:.2}% | ({} records) |",
                    self.ctx.opts.idle_secs,
                    mib(m.rss_idle_kb),
                    signed_mib(m.rss_idle_kb, i.rss_baseline_kb),
                    mib(m.memlock / 1024),
                    o.cpu_ns as f64 / 1e6,
                    100.0 * o.cpu_ns as f64 / o.wall_ns.max(1) as f64,
                    o.accounting.received
                );
            }
        }
        match i.loaded.as_ref().filter(|m| !m.sessions.is_empty()) {
            None => {
                let _ =
                    writeln!(s, "| under load (section 2, btf-tracepoint) | not measured (see section 2) | | | | | |");
            }
            Some(m) => {
                let last = m.sessions.last().expect("non-empty");
                let cpu: u64 = m.sessions.iter().map(|o| o.cpu_ns).sum();
                let wall: u64 = m.sessions.iter().map(|o| o.wall_ns).sum();
                let recs: u64 = m.sessions.iter().map(|o| o.accounting.received).sum();
                let _ = writeln!(
                    s,
                    "| under load: {} sessions, {} records (section 2, btf-tracepoint) | {} | {} (anon {}, file {}) | {} | {:.0} ms | {:.1}% | {} ns |",
                    m.sessions.len(),
                    recs,
                    mib(last.rss_end_kb),
                    signed_mib(last.rss_end_kb, m.rss_before_kb),
                    signed_mib(last.rss_end_parts.0, m.rss_before_parts.0),
                    signed_mib(last.rss_end_parts.1, m.rss_before_parts.1),
                    mib(m.memlock / 1024),
                    cpu as f64 / 1e6,
                    100.0 * cpu as f64 / wall.max(1) as f64,
                    ns(cpu as f64 / recs.max(1) as f64)
                );
            }
        }
        for r in &self.flood.rows {
            if let (Ok(m), 0) = (&r.result, r.spin_ns) {
                let o = &m.agent;
                let _ = writeln!(
                    s,
                    "| flood (3b), {} ring, full-speed consumer | {} | | | {:.0} ms | {:.1}% | {} ns |",
                    ring_label(r.ring_bytes),
                    mib(o.rss_end_kb),
                    o.cpu_ns as f64 / 1e6,
                    100.0 * o.cpu_ns as f64 / o.wall_ns.max(1) as f64,
                    ns(o.cpu_ns as f64 / o.accounting.received.max(1) as f64)
                );
            }
        }
        let _ = writeln!(
            s,
            "\nPeak RSS of the whole bench process (`VmHWM`) before section 3a: {}.\n",
            mib(self.hwm_before_offline_kb)
        );
    }

    fn render_reading(&self, s: &mut String) {
        let _ = writeln!(s, "## Reading the numbers\n");
        let sec = &self.syscalls;
        let _ =
            writeln!(s, "Section 1, per attach mode (floor: Δ of the empty entry + exit programs against no probe):\n");
        for mode in [AttachMode::SyscallTracepoint, AttachMode::RawTracepoint, AttachMode::BtfTracepoint] {
            let part = |which: Which, name: &str| match (
                sec.get(SysKind::Agent, mode, which),
                sec.get(SysKind::FloorBoth, mode, which),
                sec.baseline(which),
            ) {
                (Some(a), Some(f), Some(b)) => {
                    format!("{name}: floor {} ns, agent {} ns over it", signed(f - b), signed(a - f))
                }
                _ => format!("{name}: not measured"),
            };
            let _ = writeln!(
                s,
                "- **{}** — {}; {} (goal: within {GOAL_FLOOR_NS:.0} ns).",
                mode.as_str(),
                part(ioctl_of, "foreign ioctl"),
                part(getppid_of, "getppid")
            );
        }
        s.push('\n');
        let base = self.nv.median(NvKind::None);
        let bt = self.nv.median(NvKind::Bpftrace).zip(base).map(|(b, n)| b - n);
        let _ = writeln!(s, "Section 2, per NVIDIA ioctl:\n");
        for mode in [AttachMode::SyscallTracepoint, AttachMode::RawTracepoint, AttachMode::BtfTracepoint] {
            let a = self.nv.median(NvKind::Agent(mode)).zip(base).map(|(a, n)| a - n);
            let txt = match (a, bt) {
                (Some(a), Some(b)) if b > 0.0 => format!(
                    "{} ns per call, {:.2}× bpftrace's {} ns (goal: within {GOAL_BPFTRACE_RATIO}×)",
                    signed(a),
                    a / b,
                    signed(b)
                ),
                (Some(a), _) => format!("{} ns per call (no bpftrace comparison)", signed(a)),
                _ => "not measured".into(),
            };
            let inprog = self
                .nv
                .stats
                .as_ref()
                .ok()
                .and_then(|v| v.iter().find(|r| r.mode == mode && !r.floor && r.variant == "full"))
                .map(|r| {
                    r.progs.iter().filter(|p| p.name.starts_with("sys_")).map(|p| p.time_ns).sum::<u64>() as f64
                        / r.calls.max(1) as f64
                });
            let split = match inprog {
                Some(p) => format!("; at most {} ns of it is spent inside the programs (2b)", ns(p)),
                None => String::new(),
            };
            let _ = writeln!(s, "- **{}**: {txt}{split}.", mode.as_str());
        }
        if let Some(b) = self.breakdown() {
            let _ = writeln!(s, "\n{b}");
        }
        s.push('\n');
        if let Ok((_, t)) = &self.offline.result {
            let _ = writeln!(
                s,
                "Section 3a: decode {} and decode + state apply {} on one core (goal: ≥ 1 M/s).\n",
                rate(t.decode_per_s),
                rate(t.apply_per_s)
            );
        }
        let ok: Vec<(&FloodRow, &FloodMeasured)> =
            self.flood.rows.iter().filter_map(|r| r.result.as_ref().ok().map(|m| (r, m))).collect();
        if !ok.is_empty() {
            let loss = |m: &FloodMeasured| {
                let a = &m.agent.accounting;
                if a.seen > 0 { 100.0 * a.dropped as f64 / a.seen as f64 } else { 0.0 }
            };
            let full_speed: Vec<String> = ok
                .iter()
                .filter(|(r, _)| r.spin_ns == 0)
                .map(|(r, m)| format!("{} {:.1}%", ring_label(r.ring_bytes), loss(m)))
                .collect();
            let slowed: Vec<String> = ok
                .iter()
                .filter(|(r, _)| r.spin_ns > 0)
                .map(|(r, m)| {
                    let cap = m.agent.accounting.received as f64 * 1e9 / m.agent.cpu_ns.max(1) as f64;
                    let prod = m.calls as f64 * 1e9 / m.elapsed_ns.max(1) as f64;
                    format!("+{} ns: {:.1}% (capacity {} vs producers {})", r.spin_ns, loss(m), rate(cap), rate(prod))
                })
                .collect();
            let all_hold = ok.iter().all(|(_, m)| {
                let a = &m.agent.accounting;
                a.seen == a.received + a.dropped
            });
            let _ = writeln!(
                s,
                "Section 3b: loss with a full-speed consumer, by ring size: {}. With the {} ring and a slowed consumer: {}. \
                 Loss turns heavy where the consumer's capacity falls below the producers' rate; below that, what is lost \
                 is bursts that outrun the ring while the consumer waits to be scheduled. The accounting identity \
                 `seen == received + dropped` {} after the final drain.\n",
                full_speed.join(", "),
                ok.iter().find(|(r, _)| r.spin_ns > 0).map_or("64 KiB".to_string(), |(r, _)| ring_label(r.ring_bytes)),
                if slowed.is_empty() { "not measured".to_string() } else { slowed.join("; ") },
                if all_hold { "held exactly in every row" } else { "was **broken** in at least one row" }
            );
        }
        self.reading_cuda(s);
        let _ = writeln!(
            s,
            "How to read them:\n\n\
             - Δ values are differences of medians over rounds; compare them with the min–max ranges and the baseline \
             drift. On a 2-vCPU VM shared with other work, differences of a few tens of ns are within the noise.\n\
             - The floor is what the kernel charges to run *any* program at that hook (the syscall slow path that tracing \
             turns on, plus the program dispatch); nothing the tracer does can go below it. \"agent − floor\" is the \
             tracer's own work on a call it does not care about: reading the syscall number and its arguments and, for a \
             foreign ioctl of a process that never opened an NVIDIA device, one byte of the `TRACKED_TGIDS` array at \
             entry and at exit (a process that holds NVIDIA fds also pays an `NV_FDS` hash lookup for its other \
             ioctls). The raw-tracepoint mode reads the arguments through a helper call, tp_btf by direct loads.\n\
             - raw and btf tracepoints sit on `sys_enter`/`sys_exit` of *every* syscall, so `getppid` pays their floor \
             too; the syscall-tracepoint mode attaches nothing to `getppid` (its agent row is within noise of no probe, \
             so \"agent over floor\" is negative there) but charges the ten traced syscalls the slow path and more per call.\n\
             - bpftrace's program runs at entry only and bumps a per-cgroup counter; the agent runs at entry and exit, \
             keeps per-call state in a hash map, copies 48 + 128 bytes of user memory, writes a {RECORD_IN_RING}-byte \
             ring-buffer record and has it decoded and applied by user space; its Δ includes what the consumer thread \
             costs the machine while the calls run (2b separates the in-program part).\n\
             - In 3b loss is expected once the consumer is slower than the producers, or when a burst outruns a small \
             ring between wake-ups (one forced wake-up per {} records per CPU, plus the {} ms drain timer); what must \
             never happen is an unaccounted record: the last column checks `seen == received + dropped` exactly after the \
             final drain.\n\
             - In section 5 the cost of a uprobe is dominated by what the kernel does with the probed instruction: \
             emulated (`push rbp`) about 0.6 µs per call here, single-stepped (`endbr64`, the thunk's rip-relative \
             `cmp`) about 10 µs. The symbol-address probe and bpftrace pay the single step wherever the symbol starts \
             with such an instruction; the agent's placement moves past it. On the `push` variant all three probe the \
             same instruction, and what differs is the programs' own work. Per-event mode adds a ring-buffer record per \
             launch to the count.\n",
            tracer_core::config::Config::default().wakeup_every,
            tracer_core::config::Config::default().drain_interval_ms
        );
    }
}

impl Report<'_> {
    /// Where the btf-tracepoint capture path spends its time, from the 2b windows (ns per run).
    fn breakdown(&self) -> Option<String> {
        let v = self.nv.stats.as_ref().ok()?;
        let per_run = |variant: &str, floor: bool, prog: &str| {
            v.iter()
                .find(|r| r.mode == AttachMode::BtfTracepoint && r.variant == variant && r.floor == floor)?
                .progs
                .iter()
                .find(|p| p.name == prog)
                .map(|p| p.time_ns as f64 / p.runs.max(1) as f64)
        };
        let noop = per_run("full", true, "noop_btf")?;
        let enter = per_run("full", false, "sys_enter_btf")?;
        let exit_full = per_run("full", false, "sys_exit_btf")?;
        let exit_main = per_run("no-nested", false, "sys_exit_btf")?;
        let exit_bare = per_run("bare", false, "sys_exit_btf")?;
        Some(format!(
            "Where an NVIDIA call's in-program time goes (btf-tracepoint, 2b, each program run minus the empty \
             program's {} ns under statistics): entry (fd lookup, state kept until exit) {} ns; exit with a record but \
             nothing copied {} ns; the main window and the re-read class and pointer add {} ns; the 128-byte nested block \
             adds {} ns.",
            ns(noop),
            ns(enter - noop),
            ns(exit_bare - noop),
            ns(exit_main - exit_bare),
            ns(exit_full - exit_main)
        ))
    }
}

/// `n`, or `kept (k left out)` / `n (k with other tracers)`.
fn rounds_cell(n: usize, dropped: usize, dirty_kept: usize) -> String {
    if dropped > 0 {
        format!("{} ({dropped} left out: other tracers)", n - dropped)
    } else if dirty_kept > 0 {
        format!("{n} (**{dirty_kept} with other tracers loaded**)")
    } else {
        n.to_string()
    }
}

/// Bytes an ioctl record takes in the ring buffer: the record plus the 8-byte ring header.
const RECORD_IN_RING: usize = (size_of::<tracer_common::IoctlRecord>() + 8).div_ceil(8) * 8;

fn ring_label(bytes: u32) -> String {
    if bytes >= 1 << 20 { format!("{} MiB", bytes >> 20) } else { format!("{} KiB", bytes >> 10) }
}

fn signed_mib(a_kb: u64, b_kb: u64) -> String {
    let d = a_kb as f64 - b_kb as f64;
    if d >= 0.0 { format!("+{:.1} MiB", d / 1024.0) } else { format!("−{:.1} MiB", -d / 1024.0) }
}

/// `n ✓` when it equals `want`, else `n (expected want)`.
fn check(n: u64, want: u64) -> String {
    if n == want { format!("{n} ✓") } else { format!("**{n} (expected {want})**") }
}

fn identity(o: &Outcome) -> String {
    let a = &o.accounting;
    let holds = a.seen == a.received + a.dropped;
    format!(
        "{}: {} = {} + {}{}",
        if holds { "holds" } else { "**BROKEN**" },
        a.seen,
        a.received,
        a.dropped,
        if a.in_flight != 0 { format!(" ({} in flight)", a.in_flight) } else { String::new() }
    )
}

fn identity_all(v: &[Outcome]) -> String {
    let broken = v.iter().filter(|o| o.accounting.seen != o.accounting.received + o.accounting.dropped).count();
    let (se, re, dr) = v
        .iter()
        .fold((0, 0, 0), |(a, b, c), o| (a + o.accounting.seen, b + o.accounting.received, c + o.accounting.dropped));
    if broken == 0 {
        format!("holds in all {} sessions: {se} = {re} + {dr}", v.len())
    } else {
        format!("**BROKEN in {broken} of {} sessions**: {se} vs {re} + {dr}", v.len())
    }
}

// ---------------------------------------------------------------------------------------------
// Section 5.

fn cuda_probe_label(p: CudaProbe) -> &'static str {
    match p {
        CudaProbe::None => "no probe",
        CudaProbe::Agent => "**agent, count mode** (placed)",
        CudaProbe::PerEvent => "**agent, per-event mode** (placed; this cgroup selected)",
        CudaProbe::AgentPerf => "agent, count mode, perf-event uprobes (shared programs, attach cookies)",
        CudaProbe::AgentPerEntry => "agent, count mode, perf-event uprobes, one program per entry point (no cookies)",
        CudaProbe::Symbol => "`cuda_count` at the symbol address",
        CudaProbe::Bpftrace => "bpftrace `uprobe:LIB:cuLaunchKernel`",
    }
}

/// `a` relative to `b` as "N×", when both are positive.
fn times(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 && a > 0.0 => Some(a / b),
        _ => None,
    }
}

impl CudaSection {
    /// Δ of `probe` on library `lib` against that library's no-probe median.
    pub fn delta(&self, lib: usize, probe: CudaProbe) -> Option<f64> {
        Some(self.median(lib, probe)? - self.median(lib, CudaProbe::None)?)
    }

    /// Median detach time (s) of `probe` over all libraries' sessions.
    fn detach_median(&self, probe: CudaProbe) -> Option<(f64, usize)> {
        let v: Vec<f64> = self
            .rows
            .iter()
            .filter(|r| r.probe == probe)
            .filter_map(|r| r.result.as_ref().ok())
            .flat_map(|m| m.detach_s.iter().copied())
            .collect();
        let n = self
            .rows
            .iter()
            .filter(|r| r.probe == probe)
            .filter_map(|r| r.result.as_ref().ok())
            .map(|m| m.uprobes)
            .max()
            .unwrap_or(0);
        (!v.is_empty()).then(|| (sys::median(&v), n))
    }
}

/// A rounds cell with the failed rounds appended.
fn failed_rounds(mut cell: String, failures: &[String]) -> String {
    if let Some(e) = failures.first() {
        let _ = write!(cell, " (+{} failed: {})", failures.len(), one_line(e));
    }
    cell
}

fn cuda_rounds_cell(m: &CudaMeasured) -> String {
    failed_rounds(rounds_cell(m.dirty.len(), m.dropped_rounds, m.dirty_kept()), &m.failures)
}

fn cuda_count_cell(m: &CudaMeasured) -> String {
    let counted = cuda_counted_cell(m);
    match m.events {
        None => counted,
        Some(e) if m.event_mismatches.is_empty() => format!("{counted}; records received {}", check(e, m.total)),
        Some(e) => format!(
            "{counted}; **records received {e} (made {}; {} rounds differ)**",
            m.total,
            m.event_mismatches.len()
        ),
    }
}

fn cuda_counted_cell(m: &CudaMeasured) -> String {
    match m.counted {
        None => String::new(),
        Some(c) if m.mismatches.is_empty() => check(c, m.total),
        Some(c) => format!(
            "**{c} (made {}; {} of {} rounds differ: {})**",
            m.total,
            m.mismatches.len(),
            m.dirty.len(),
            m.mismatches.iter().map(|(a, b)| format!("{b} for {a}")).collect::<Vec<_>>().join(", ")
        ),
    }
}

impl Report<'_> {
    fn render_cuda(&self, s: &mut String) {
        let sec = &self.cuda;
        let c = self.ctx;
        let _ = writeln!(s, "## 5. Cost per libcuda launch (`cuLaunchKernel` uprobes)\n");
        if let Some(why) = &sec.skipped {
            let _ = writeln!(s, "not measured: {}\n", one_line(why));
            return;
        }
        let (agent_detach, symbol_detach) = (sec.detach_median(CudaProbe::Agent), sec.detach_median(CudaProbe::Symbol));
        let agent_uprobes = {
            let v: Vec<usize> = sec
                .rows
                .iter()
                .filter(|r| r.probe == CudaProbe::Agent)
                .filter_map(|r| r.result.as_ref().ok())
                .map(|m| m.uprobes)
                .filter(|n| *n > 0)
                .collect();
            match (v.iter().min(), v.iter().max()) {
                (Some(a), Some(b)) if a == b => a.to_string(),
                (Some(a), Some(b)) => format!("{a}–{b}"),
                _ => "~40".to_string(),
            }
        };
        let init = sec
            .libs
            .iter()
            .position(|l| l.short == "real")
            .and_then(|i| sec.get(i, CudaProbe::None))
            .map(|m| (m.init, m.first_ret));
        let _ = writeln!(
            s,
            "**Method.** A child pinned to CPU {} `dlopen`s the library (`RTLD_NOW | RTLD_LOCAL`, as cudart does), calls \
             `cuInit(0)`, resolves `cuLaunchKernel` through `cuGetProcAddress_v2(\"cuLaunchKernel\", 12000, 0)` (as cudart \
             does) and calls it through that pointer in a tight loop. On the fakes `cuInit` succeeds and the launches get a \
             function from `cuModuleLoadData` + `cuModuleGetFunction`, so each returns CUDA_SUCCESS; on the real library \
             there is no GPU ({}), so the function is NULL and each launch returns an error at once. {} warm-up calls \
             estimate the cost per call; the timed run then makes as many calls as fit in {} ms (at least {}, at most {}). \
             ns/call is the child thread's CPU time per call (the uprobe trap, the program and, where the kernel cannot \
             emulate the probed instruction, the single-step trap are all charged to it); wall clock alongside. \
             Configurations, each attached before the child starts and detached after it exits: **no probe**; **agent** \
             — a `pipeline::Agent` (its consumer thread on CPU {}) with only the cuda family (`families.driver` and \
             `families.lifecycle` off) and `cuda_libraries` = that library, i.e. every entry point the library has ({} \
             uprobes) placed by `cuda::placement` exactly as in production; in that session the child runs twice: in \
             **count mode** (the launch counted by `cuda_count` in the per-CPU `CUDA_COUNTS` map, nothing sent) and then \
             in **per-event mode**, switched on at run time for the bench's own cgroup with `Agent::set_per_event` (as \
             `profile` does; every launch is also sent as a record with grid, block, shared memory and stream, which the \
             agent drains and decodes meanwhile); the agent in count mode again with **perf-event uprobes** \
             (`cuda_attach = perf-event`: the shared programs, the entry id as each uprobe's attach cookie, as \
             kernels 5.15–6.5 get) and with **one program per entry point** (`cuda_entry_programs = per-entry`: \
             each entry point's id a constant in its own program, perf-event uprobes without cookies, as kernels \
             before 5.15 get; the two differ only in the cookie); **`cuda_count` at the symbol address** — the same program alone, \
             attached by aya at `UProbeAttachLocation::Symbol(\"cuLaunchKernel\")` (no placement: the naive baseline the \
             placement has to beat); **bpftrace** — `{}` (also at the symbol address; started, awaited until attached, \
             then measured). {} rounds; in each, every configuration of every library is attached, measured and \
             detached. Counts, read after the child exited: for the agent, the launches its CUDA snapshot holds for the \
             child's tgid (its `CUDA_COUNTS` rows, read with `tracer_agent::source::cuda_counts::read`), the per-event \
             records its sink received for that tgid, and the probes' kernel counters: `cuda_call` (every counted \
             entry point the child called, so the fakes' `cuDevicePrimaryCtxRetain` and `cuModuleGetFunction` too; seen \
             must equal aggregated + dropped) and `cuda_launch` (the records: seen must equal emitted + dropped); for \
             the symbol-address program, `CUDA_COUNTS` for the child's tgid read the same way, before detaching; for \
             bpftrace, its map total. Each count must equal the `cuLaunchKernel` calls the child made (the first call, \
             the warm-up and the timed run).\n",
            c.worker_cpu,
            match init {
                Some((i, r)) => format!("`cuInit` returned {i}; a launch returns {r}"),
                None => "`cuInit` fails".to_string(),
            },
            sec.warmup,
            sec.target_ms,
            sec.min_calls,
            sec.max_calls,
            c.agent_cpu.map_or("any".to_string(), |c| c.to_string()),
            agent_uprobes,
            bpftrace::cuda_program("LIB"),
            sec.rounds
        );
        let _ = writeln!(
            s,
            "Detaching: stopping the agent with its {} uprobes took {} s per session (median), the single uprobe of \
             the symbol-address configuration (a perf-event link) {} s. The agent holds its uprobes in multi-uprobe \
             links where the kernel has them (one per program; the kernel unregisters a link's uprobes under one RCU \
             grace period), so a library detaches in about the time of one perf-event uprobe; section 5c compares the \
             ways.\n",
            agent_uprobes,
            agent_detach.map_or("?".to_string(), |(d, _)| format!("{d:.2}")),
            symbol_detach.map_or("?".to_string(), |(d, _)| format!("{d:.2}")),
        );
        let _ = writeln!(
            s,
            "**Goals:** count mode no slower than bpftrace on any library; on the real libcuda and the `endbr64` \
             variant, count mode at least {GOAL_CUDA_VS_SYMBOL:.0}× cheaper than a probe at the symbol address (compared on \
             Δ, what the probe adds to a call); per-event mode under 2× count mode.\n"
        );
        let _ = writeln!(s, "Where the probes go (`cuLaunchKernel`):\n");
        let _ = writeln!(
            s,
            "| library | file | instruction at the symbol (naive probe, bpftrace) | agent's probe point | agent's uprobes on the library (kernel links) |"
        );
        let _ = writeln!(s, "|---|---|---|---|---:|");
        for (li, l) in sec.libs.iter().enumerate() {
            let placed = match &l.placement {
                Ok(p) => {
                    let mut t = format!(
                        "{}: `{}` ({}) at {:#x}",
                        p.kind.as_str(),
                        p.first_insn,
                        p.first_insn_class.as_str(),
                        p.probe_addr
                    );
                    for hop in &p.thunk {
                        let _ = write!(
                            t,
                            "; thunk {:#x} via slot {:#x} ({})",
                            hop.thunk_addr, hop.slot_addr, hop.relocation
                        );
                    }
                    if !p.skipped.is_empty() {
                        let _ = write!(t, "; skipped `{}`", p.skipped.join("; "));
                    }
                    t
                }
                Err(e) => format!("not placed: {}", one_line(e)),
            };
            let sym = match &l.symbol_insn {
                Ok(t) => t.clone(),
                Err(e) => format!("? ({})", one_line(e)),
            };
            let path = l.path.display().to_string();
            // The fakes live in the build directory: keep the part that names the variant.
            let path = match path.find("/fake-libcuda/") {
                Some(i) => format!("`$CARGO_TARGET_DIR/…{}`", &path[i..]),
                None => format!("`{path}`"),
            };
            let uprobes =
                sec.get(li, CudaProbe::Agent).map_or(String::new(), |m| format!("{} in {} links", m.uprobes, m.links));
            let _ = writeln!(s, "| {} | {path} | {sym} | {placed} | {uprobes} |", l.label);
        }
        s.push('\n');
        let _ = writeln!(
            s,
            "| library | probe | ns/call (CPU) | Δ vs no probe | Δ ÷ agent's Δ | wall ns/call | rounds | timed calls (last round) | calls made | counted | `cuda_call` seen = aggregated + dropped |"
        );
        let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---|");
        for (li, l) in sec.libs.iter().enumerate() {
            let agent_d = sec.delta(li, CudaProbe::Agent);
            for r in sec.rows.iter().filter(|r| r.lib == li) {
                let label = cuda_probe_label(r.probe);
                match &r.result {
                    Err(e) => {
                        let _ =
                            writeln!(s, "| {} | {label} | not measured: {} | | | | | | | | |", l.label, one_line(e));
                    }
                    Ok(m) if m.runs.is_empty() => {
                        let _ = writeln!(s, "| {} | {label} | not measured | | | | | | | | |", l.label);
                    }
                    Ok(m) => {
                        let med = sys::median(&m.runs);
                        let d = sec.delta(li, r.probe).filter(|_| r.probe != CudaProbe::None);
                        let ratio = match r.probe {
                            CudaProbe::PerEvent
                            | CudaProbe::AgentPerf
                            | CudaProbe::AgentPerEntry
                            | CudaProbe::Symbol
                            | CudaProbe::Bpftrace => times(d, agent_d).map(|x| format!("{x:.1}×")).unwrap_or_default(),
                            _ => String::new(),
                        };
                        let mut ident = m.counters.map_or(String::new(), |k| {
                            let holds = k.seen == k.aggregated + k.dropped() && k.emitted == 0;
                            format!(
                                "{}: {} = {} + {}",
                                if holds { "holds" } else { "**BROKEN**" },
                                k.seen,
                                k.aggregated,
                                k.dropped()
                            )
                        });
                        if let Some(k) = m.launch_counters {
                            let holds = k.seen == k.emitted + k.dropped();
                            let _ = write!(
                                ident,
                                "; launch records (`cuda_launch`): seen {} = emitted {} + dropped {}{}",
                                k.seen,
                                k.emitted,
                                k.dropped(),
                                if holds { "" } else { " **BROKEN**" }
                            );
                        }
                        let _ = writeln!(
                            s,
                            "| {} | {label} | {} ({}–{}) | {} | {ratio} | {} | {} | {} | {} | {} | {ident} |",
                            l.label,
                            ns(med),
                            ns(sys::min(&m.runs)),
                            ns(sys::max(&m.runs)),
                            d.map(signed).unwrap_or_default(),
                            ns(sys::median(&m.wall)),
                            cuda_rounds_cell(m),
                            m.timed_calls,
                            m.total,
                            cuda_count_cell(m),
                        );
                    }
                }
            }
        }
        s.push('\n');
        let resolved: Vec<String> = sec
            .libs
            .iter()
            .enumerate()
            .filter_map(|(i, l)| sec.get(i, CudaProbe::None).map(|m| format!("{}: {}", l.label, m.resolved)))
            .collect();
        if !resolved.is_empty() {
            let _ = writeln!(s, "`cuLaunchKernel` as resolved by the child: {}.\n", resolved.join("; "));
        }

        let _ = writeln!(s, "### 5b. Launch rate from two threads, counted by the agent\n");
        let _ = writeln!(
            s,
            "**Method.** A child with {} threads (pinned to CPUs {}) calls `cuLaunchKernel` of the fake `push` variant \
             {} times each, as fast as it can, all starting together; rate = all launches ÷ the slowest thread's time \
             (wall clock: it depends on what else the machine runs; the CPU time the threads spent per launch is \
             alongside). \
             Without the agent, then with the agent running as in production (`pipeline::Agent`: every probe family, \
             `cuda_libraries` = that library, count mode, its consumer thread on CPU {}), {} rounds. After the child has \
             exited and the agent has drained, the `cuda_call` probe's kernel counters are read (seen, aggregated into \
             `CUDA_COUNTS`, dropped: seen must equal aggregated + dropped) and the launches the agent's CUDA snapshot \
             counted for `cuLaunchKernel` (which must equal the calls made).\n",
            sec.throughput_cpus.len(),
            sec.throughput_cpus.iter().map(ToString::to_string).collect::<Vec<_>>().join(" and "),
            sec.per_thread_calls,
            c.agent_cpu.map_or("any".to_string(), |c| c.to_string()),
            sec.throughput_rounds
        );
        let _ = writeln!(
            s,
            "| configuration | launches per round | launches/s (median, min–max) | wall ns per launch per thread | CPU ns per launch | agent CPU (% of one CPU) | `cuda_call` seen | aggregated | dropped | counted by the agent | seen == aggregated + dropped |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
        for r in &sec.throughput {
            let label = if r.with_agent { "**agent, count mode**" } else { "no agent" };
            match &r.result {
                Err(e) => {
                    let _ = writeln!(s, "| {label} | not measured: {} | | | | | | | | | |", one_line(e));
                }
                Ok(v) if v.is_empty() => {
                    let _ = writeln!(s, "| {label} | not measured | | | | | | | | | |");
                }
                Ok(v) => {
                    let rates: Vec<f64> = v.iter().map(|t| t.calls as f64 * 1e9 / t.wall_ns.max(1) as f64).collect();
                    let per_thread: Vec<f64> =
                        v.iter().map(|t| t.wall_ns as f64 / (t.calls as f64 / t.threads.max(1) as f64)).collect();
                    let cpu_per: Vec<f64> = v.iter().map(|t| t.cpu_ns as f64 / t.calls.max(1) as f64).collect();
                    let failed: u64 = v.iter().map(|t| t.failed).sum();
                    let calls = v[0].calls;
                    let total: u64 = v.iter().map(|t| t.total).sum();
                    let mut cells = vec![String::new(); 6];
                    let agents: Vec<&Outcome> = v.iter().filter_map(|t| t.agent.as_ref()).collect();
                    if !agents.is_empty() {
                        let sum = |f: fn(&Outcome) -> u64| agents.iter().map(|o| f(o)).sum::<u64>();
                        let (seen, agg, dropped) =
                            (sum(|o| o.cuda.seen), sum(|o| o.cuda.aggregated), sum(|o| o.cuda.dropped()));
                        let cpu: f64 = agents.iter().map(|o| o.cpu_ns as f64).sum();
                        let wall: f64 = agents.iter().map(|o| o.wall_ns as f64).sum();
                        let broken =
                            agents.iter().filter(|o| o.cuda.seen != o.cuda.aggregated + o.cuda.dropped()).count();
                        let counted = sum(|o| o.cuda_launches);
                        cells = vec![
                            format!("{:.1}%", 100.0 * cpu / wall.max(1.0)),
                            seen.to_string(),
                            agg.to_string(),
                            dropped.to_string(),
                            check(counted, total),
                            if broken == 0 {
                                format!("holds in all {} sessions", agents.len())
                            } else {
                                format!("**BROKEN in {broken} of {} sessions**", agents.len())
                            },
                        ];
                    }
                    let _ = writeln!(
                        s,
                        "| {label} | {calls}{} | {} ({}–{}) | {} | {} | {} |",
                        if failed > 0 { format!(" (**{failed} failed**)") } else { String::new() },
                        rate(sys::median(&rates)),
                        rate(sys::min(&rates)),
                        rate(sys::max(&rates)),
                        ns(sys::median(&per_thread)),
                        ns(sys::median(&cpu_per)),
                        cells.join(" | ")
                    );
                }
            }
        }
        s.push('\n');
        crate::cuda::detach::render(s, &sec.detach, sec.rounds);
    }

    /// Section 5's lines for "Reading the numbers".
    fn reading_cuda(&self, s: &mut String) {
        let sec = &self.cuda;
        if sec.skipped.is_some() || sec.libs.is_empty() {
            return;
        }
        let _ = writeln!(s, "Section 5, per `cuLaunchKernel` call (Δ against no probe on the same library):\n");
        for (i, l) in sec.libs.iter().enumerate() {
            let a = sec.delta(i, CudaProbe::Agent);
            let sym = sec.delta(i, CudaProbe::Symbol);
            let bt = sec.delta(i, CudaProbe::Bpftrace);
            let Some(a) = a else {
                let _ = writeln!(s, "- **{}**: count mode not measured.", l.label);
                continue;
            };
            let at_symbol = l.placement.as_ref().is_ok_and(|p| p.probe_addr == p.symbol_addr);
            let vs_sym = match times(sym, Some(a)) {
                Some(_) if at_symbol => format!(
                    "the agent probes the symbol itself here (its first instruction is emulated), as the naive probe does ({} ns)",
                    signed(sym.unwrap_or(0.0))
                ),
                Some(x) => {
                    let goal = if l.short == "real" || l.short == "endbr64" {
                        format!(
                            " — goal ≥ {GOAL_CUDA_VS_SYMBOL:.0}×: **{}**",
                            if x >= GOAL_CUDA_VS_SYMBOL { "met" } else { "not met" }
                        )
                    } else {
                        String::new()
                    };
                    format!("{x:.1}× cheaper than at the symbol ({} ns){goal}", signed(sym.unwrap_or(0.0)))
                }
                None => "symbol-address probe not measured".into(),
            };
            let vs_bt = match bt {
                Some(b) => format!(
                    "bpftrace {} ns, {:.1}× the agent's Δ — goal agent ≤ bpftrace: **{}**",
                    signed(b),
                    if a > 0.0 { b / a } else { f64::NAN },
                    if a <= b { "met" } else { "not met" }
                ),
                None => "bpftrace not measured".into(),
            };
            let counted = sec.get(i, CudaProbe::Agent).is_some_and(|m| m.mismatches.is_empty() && m.counted.is_some());
            let _ = writeln!(
                s,
                "- **{}**: count mode {} ns per call; {vs_sym}; {vs_bt}; counts {}.",
                l.label,
                signed(a),
                if counted { "exact" } else { "**not exact**" }
            );
        }
        let pe: Vec<String> = sec
            .libs
            .iter()
            .enumerate()
            .filter_map(|(i, l)| {
                let (a, p) = (sec.delta(i, CudaProbe::Agent)?, sec.delta(i, CudaProbe::PerEvent)?);
                let exact = sec
                    .get(i, CudaProbe::PerEvent)
                    .is_some_and(|m| m.event_mismatches.is_empty() && m.mismatches.is_empty() && m.events.is_some());
                Some(format!(
                    "{} {} ns, {:.2}× count mode ({}{})",
                    l.short,
                    signed(p),
                    p / a,
                    if p / a < 2.0 { "met" } else { "**not met**" },
                    if exact { ", every launch sent and received" } else { ", **records missing**" }
                ))
            })
            .collect();
        if !pe.is_empty() {
            let _ = writeln!(s, "- Per-event mode (goal: under 2× count mode): {}.", pe.join("; "));
        }
        if let Some(r) = sec.throughput.iter().find(|r| r.with_agent).and_then(|r| r.result.as_ref().ok()) {
            let rates: Vec<f64> = r.iter().map(|t| t.calls as f64 * 1e9 / t.wall_ns.max(1) as f64).collect();
            let cpu_per: Vec<f64> = r.iter().map(|t| t.cpu_ns as f64 / t.calls.max(1) as f64).collect();
            let exact = r.iter().all(|t| {
                t.agent
                    .as_ref()
                    .is_some_and(|o| o.cuda.seen == o.cuda.aggregated + o.cuda.dropped() && o.cuda_launches == t.total)
            });
            let dropped: u64 = r.iter().filter_map(|t| t.agent.as_ref()).map(|o| o.cuda.dropped()).sum();
            if !rates.is_empty() {
                let _ = writeln!(
                    s,
                    "- 5b: the agent counted launches from two threads (fake `push`) at {}, {} dropped, {}. Each launch cost \
                     its thread {} ns of CPU, so two CPUs to themselves would sustain about {}; the rate measured is what \
                     the threads got of the machine.",
                    rate(sys::median(&rates)),
                    dropped,
                    if exact { "every launch accounted for and counted" } else { "**accounting not exact**" },
                    ns(sys::median(&cpu_per)),
                    rate(2e9 / sys::median(&cpu_per).max(1.0)),
                );
            }
        }
        s.push('\n');
    }
}

#[cfg(test)]
mod tests;
