//! Section 5: what a `cuLaunchKernel` call pays under each kind of uprobe, on the real libcuda and
//! on the three fake prologue variants; and how many launches per second the agent counts from two
//! threads without losing any.
use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, MapData},
    programs::{
        UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope},
    },
};
use tracer_agent::{
    cuda::placement::{self, ProbePlacement},
    pipeline::Agent,
};
use tracer_common::{TracerConfig, cuda_entry, map_names, probe, prog_names};
use tracer_core::{
    config::{AttachMode, Config, CudaAttach, CudaEntryPrograms, Families},
    decode::Event,
    model::{
        EventContext,
        counters::{KernelCounters, ProbeCounters},
    },
};

use crate::{Ctx, agent_config, agent_run, progress, report::Timing, sys, values};

/// The symbol every configuration probes and every worker calls.
pub const SYMBOL: &str = "cuLaunchKernel";
/// The kernel's name for the counters of the `cuda_count` program.
pub fn counter_name() -> &'static str {
    probe::NAMES[probe::CUDA_CALL as usize]
}

/// One library measured.
pub struct LibInfo {
    /// `real libcuda 535.261.03`, `fake \`push\``, ...
    pub label: String,
    /// Short name for prose: `real`, `push`, `endbr64`, `thunk`.
    pub short: String,
    /// The file (symlinks resolved).
    pub path: PathBuf,
    /// Where the agent puts the `cuLaunchKernel` probe.
    pub placement: Result<ProbePlacement, String>,
    /// The instruction at the symbol address, Intel syntax, with what the kernel does with it.
    pub symbol_insn: Result<String, String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CudaProbe {
    None,
    /// The agent with only the cuda family, on this library: its placement, count mode.
    Agent,
    /// The same session with per-event mode switched on for this cgroup.
    PerEvent,
    /// The agent in count mode with perf-event uprobes (`cuda_attach = perf-event`): the shared
    /// programs, the entry id as each probe's attach cookie (what 5.15–6.5 kernels get).
    AgentPerf,
    /// The agent in count mode with one program per entry point and no cookies
    /// (`cuda_entry_programs = per-entry`, perf-event uprobes: what kernels before 5.15 get).
    AgentPerEntry,
    /// `cuda_count` attached at the symbol address (no placement).
    Symbol,
    /// bpftrace's `uprobe:LIB:cuLaunchKernel { @[cgroup] = count(); }`.
    Bpftrace,
}

pub const PROBES: [CudaProbe; 7] = [
    CudaProbe::None,
    CudaProbe::Agent,
    CudaProbe::PerEvent,
    CudaProbe::AgentPerf,
    CudaProbe::AgentPerEntry,
    CudaProbe::Symbol,
    CudaProbe::Bpftrace,
];

#[derive(Clone, Debug, Default)]
pub struct CudaMeasured {
    /// CPU-time ns/call, one per round.
    pub runs: Vec<f64>,
    pub wall: Vec<f64>,
    pub dirty: Vec<bool>,
    pub dropped_rounds: usize,
    /// Timed calls of the last round.
    pub timed_calls: u64,
    /// Calls of `cuLaunchKernel` the workers made, over all rounds (first call and warm-up included).
    pub total: u64,
    /// What the probe counted over all rounds (`CUDA_COUNTS` for the worker's tgid, or bpftrace's
    /// map total); `None` for no probe.
    pub counted: Option<u64>,
    /// Rounds in which the count differed from the calls made: `(made, counted)`.
    pub mismatches: Vec<(u64, u64)>,
    /// `cuda_call` counters summed over rounds (our programs only).
    pub counters: Option<ProbeCounters>,
    /// Per-event mode: launch records the agent received for the child, over all rounds, the
    /// rounds where that differed from the calls made, and the `cuda_launch` probe's counters.
    pub events: Option<u64>,
    pub event_mismatches: Vec<(u64, u64)>,
    pub launch_counters: Option<ProbeCounters>,
    /// Rounds that failed, and why.
    pub failures: Vec<String>,
    /// Seconds each detach (dropping the programs) took.
    pub detach_s: Vec<f64>,
    /// Uprobes the configuration attached.
    pub uprobes: usize,
    /// The kernel links (perf events or BPF links) holding them.
    pub links: usize,
    /// What the first launch and `cuInit` returned, and how `cuLaunchKernel` was resolved.
    pub first_ret: i32,
    pub init: i32,
    pub resolved: String,
}

impl CudaMeasured {
    fn drop_dirty_rounds(&mut self) {
        let n = self.dirty.iter().filter(|d| **d).count();
        if n == 0 || n == self.dirty.len() {
            return;
        }
        let d = self.dirty.clone();
        let keep = |v: &mut Vec<f64>| {
            let mut i = 0;
            v.retain(|_| {
                let k = !d[i];
                i += 1;
                k
            });
        };
        keep(&mut self.runs);
        keep(&mut self.wall);
        self.dropped_rounds = n;
    }

    pub fn dirty_kept(&self) -> usize {
        if self.dropped_rounds == 0 { self.dirty.iter().filter(|d| **d).count() } else { 0 }
    }

    pub fn median(&self) -> Option<f64> {
        (!self.runs.is_empty()).then(|| sys::median(&self.runs))
    }
}

pub struct CudaRow {
    pub lib: usize,
    pub probe: CudaProbe,
    pub result: Result<CudaMeasured, String>,
}

/// One 2-thread launch run (5b).
#[derive(Clone, Debug, Default)]
pub struct ThreadsRun {
    pub wall_ns: u64,
    pub calls: u64,
    pub threads: usize,
    pub failed: u64,
    /// CPU time of all launching threads together.
    pub cpu_ns: u64,
    pub total: u64,
    pub agent: Option<agent_run::Outcome>,
}

pub struct ThroughputRow {
    pub with_agent: bool,
    pub result: Result<Vec<ThreadsRun>, String>,
}

pub struct CudaSection {
    pub libs: Vec<LibInfo>,
    pub rows: Vec<CudaRow>,
    pub throughput: Vec<ThroughputRow>,
    pub throughput_cpus: Vec<usize>,
    pub per_thread_calls: u64,
    pub warmup: u64,
    pub target_ms: u64,
    pub min_calls: u64,
    pub max_calls: u64,
    pub rounds: u32,
    pub throughput_rounds: u32,
    /// Why nothing was measured (e.g. a library is missing), when the whole section failed.
    pub skipped: Option<String>,
    /// 5c: attach and detach times per library.
    pub detach: Vec<detach::DetachRow>,
}

impl CudaSection {
    pub fn skipped(why: &str) -> Self {
        CudaSection {
            libs: vec![],
            rows: vec![],
            throughput: vec![],
            throughput_cpus: vec![],
            per_thread_calls: 0,
            warmup: 0,
            target_ms: 0,
            min_calls: 0,
            max_calls: 0,
            rounds: 0,
            throughput_rounds: 0,
            skipped: Some(why.to_string()),
            detach: vec![],
        }
    }

    pub fn get(&self, lib: usize, probe: CudaProbe) -> Option<&CudaMeasured> {
        self.rows.iter().find(|r| r.lib == lib && r.probe == probe).and_then(|r| r.result.as_ref().ok())
    }

    pub fn median(&self, lib: usize, probe: CudaProbe) -> Option<f64> {
        self.get(lib, probe).and_then(CudaMeasured::median)
    }
}

// ---------------------------------------------------------------------------------------------
// The libraries.

/// The instruction at `symbol` in the ELF file `bytes`, Intel syntax, with its uprobe class.
fn symbol_instruction(bytes: &[u8], symbol: &str) -> Result<String> {
    use iced_x86::{Decoder, DecoderOptions, Formatter as _, IntelFormatter, Mnemonic, OpKind};
    use object::{Object as _, ObjectSection as _, ObjectSymbol as _};
    let obj = object::File::parse(bytes).context("parsing the ELF file")?;
    let sym = obj
        .dynamic_symbols()
        .find(|s| s.name() == Ok(symbol))
        .with_context(|| format!("{symbol} is not in the dynamic symbol table"))?;
    let section = obj.section_by_index(sym.section_index().context("symbol without a section")?)?;
    let (off, size) = section.file_range().context("symbol in a section without file data")?;
    let rel = sym.address().checked_sub(section.address()).context("symbol before its section")?;
    let start = usize::try_from(off + rel)?;
    let end = usize::try_from((off + size).min(off + rel + 16))?;
    let code = bytes.get(start..end).context("symbol outside the file")?;
    let mut d = Decoder::with_ip(64, code, sym.address(), DecoderOptions::NONE);
    let insn = d.decode();
    if insn.is_invalid() {
        bail!("undecodable instruction at {:#x}", sym.address());
    }
    let mut text = String::new();
    IntelFormatter::new().format(&insn, &mut text);
    let class = if insn.mnemonic() == Mnemonic::Endbr64 {
        "single-stepped"
    } else if insn.is_ip_rel_memory_operand() {
        "rip-relative: single-stepped"
    } else if insn.mnemonic() == Mnemonic::Push && insn.op0_kind() == OpKind::Register && insn.len() <= 2 {
        "emulated"
    } else {
        "not in the emulated list"
    };
    Ok(format!("`{text}` ({class})"))
}

fn lib_info(label: String, short: &str, path: &Path) -> LibInfo {
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let bytes = std::fs::read(&path).map_err(|e| format!("reading {}: {e}", path.display()));
    LibInfo {
        label,
        short: short.to_string(),
        placement: bytes
            .as_ref()
            .map_err(Clone::clone)
            .and_then(|b| placement::place(b, SYMBOL).map_err(|e| e.to_string())),
        symbol_insn: bytes
            .as_ref()
            .map_err(Clone::clone)
            .and_then(|b| symbol_instruction(b, SYMBOL).map_err(|e| format!("{e:#}"))),
        path,
    }
}

fn libraries() -> Vec<LibInfo> {
    let real = PathBuf::from(gpu_tracer_tests::fake_libcuda::REAL_LIBCUDA);
    let resolved = std::fs::canonicalize(&real).unwrap_or_else(|_| real.clone());
    // libcuda.so.535.261.03 → "535.261.03"
    let version = resolved
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("libcuda.so."))
        .filter(|v| v.contains('.'))
        .map(|v| format!(" {v}"))
        .unwrap_or_default();
    let mut libs = vec![lib_info(format!("real libcuda{version}"), "real", &real)];
    for v in gpu_tracer_tests::fake_libcuda::VARIANTS {
        let p = PathBuf::from(gpu_tracer_tests::fake_libcuda::FAKE_LIBCUDA_DIR).join(v).join("libcuda.so.1");
        libs.push(lib_info(format!("fake `{v}`"), v, &p));
    }
    libs
}

// ---------------------------------------------------------------------------------------------
// The probes.

/// The eBPF object loaded as the agent loads it, with only `cuda_count` attached, at the symbol
/// address of `cuLaunchKernel` in `lib` (no placement).
fn symbol_probe(lib: &Path) -> Result<Ebpf> {
    let mut ebpf = EbpfLoader::new()
        // cuda_count writes no record: keep the ring buffer at its smallest.
        .map_max_entries(map_names::EVENTS, 4096)
        .map_max_entries(map_names::BULK_EVENTS, 4096)
        .map_max_entries(map_names::TRACKED_TGIDS, tracer_agent::probe::tracked_tgids_entries())
        .load(tracer_agent::probe::EBPF_OBJECT)
        .context("loading the eBPF object")?;
    {
        let m = ebpf.map_mut(map_names::CONFIG).context("CONFIG map missing")?;
        let mut a: Array<&mut MapData, TracerConfig> = Array::try_from(m)?;
        a.set(0, tracer_agent::probe::tracer_config(&Config::default()), 0)?;
    }
    let p: &mut UProbe =
        ebpf.program_mut(prog_names::CUDA_COUNT).context("cuda_count missing from the object")?.try_into()?;
    p.load().context("loading cuda_count")?;
    let point = UProbeAttachPoint {
        location: UProbeAttachLocation::Symbol(SYMBOL),
        cookie: Some(u64::from(cuda_entry::LAUNCH_KERNEL)),
    };
    p.attach(point, lib, UProbeScope::AllProcesses).with_context(|| format!("attaching cuda_count at {SYMBOL}"))?;
    Ok(ebpf)
}

/// `cuLaunchKernel` calls of `tgid` in the object's `CUDA_COUNTS`, and the `cuda_call` counters.
fn kernel_counts(ebpf: &Ebpf, tgid: u32) -> Result<(u64, ProbeCounters)> {
    let calls = tracer_agent::source::cuda_counts::read(ebpf)
        .iter()
        .filter(|(k, _)| k.tgid == tgid && k.entry == cuda_entry::LAUNCH_KERNEL)
        .map(|(_, c)| c.calls)
        .sum();
    let kc = tracer_agent::source::counters::read(ebpf).context("reading COUNTERS")?;
    Ok((calls, kc.get(counter_name())))
}

// ---------------------------------------------------------------------------------------------
// Measuring.

struct WorkerRun {
    timing: Timing,
    calls: u64,
    total: u64,
    pid: u32,
    first_ret: i32,
    init: i32,
    resolved: String,
}

fn first(lines: &[String], key: &str) -> Option<f64> {
    values(lines, key).first().and_then(|v| v.first().copied())
}

fn run_worker(ctx: &Ctx, sec: &CudaSection, lib: &Path) -> Result<WorkerRun> {
    let lines = ctx.worker(&[
        "cuda".into(),
        lib.display().to_string(),
        ctx.worker_cpu.to_string(),
        sec.warmup.to_string(),
        sec.target_ms.to_string(),
        sec.min_calls.to_string(),
        sec.max_calls.to_string(),
    ])?;
    let timing = crate::timing(&lines, "cuda")?;
    let resolved = lines.iter().find_map(|l| l.strip_prefix("resolved ")).unwrap_or("?");
    let resolved = match resolved.split_whitespace().collect::<Vec<_>>().as_slice() {
        [via, addr, dl] if addr == dl => format!("{via} (= dlsym)"),
        [via, addr, dl] => format!("{via} ({addr} ≠ dlsym {dl})"),
        _ => resolved.to_string(),
    };
    Ok(WorkerRun {
        timing,
        calls: first(&lines, "calls").context("worker printed no calls")? as u64,
        total: first(&lines, "total").context("worker printed no total")? as u64,
        pid: first(&lines, "pid").context("worker printed no pid")? as u32,
        first_ret: first(&lines, "first_ret").unwrap_or(f64::NAN) as i32,
        init: first(&lines, "init").unwrap_or(f64::NAN) as i32,
        resolved,
    })
}

/// Add one worker run to `acc`: its timing, the calls it made and what was counted.
fn record(ctx: &Ctx, acc: &mut CudaMeasured, run: &WorkerRun, counted: Option<u64>, counters: Option<ProbeCounters>) {
    acc.runs.push(run.timing.cpu);
    acc.wall.push(run.timing.wall);
    acc.dirty.push(!ctx.last_foreign.borrow().is_empty());
    acc.timed_calls = run.calls;
    acc.total += run.total;
    acc.first_ret = run.first_ret;
    acc.init = run.init;
    acc.resolved = run.resolved.clone();
    if let Some(c) = counted {
        *acc.counted.get_or_insert(0) += c;
        if c != run.total {
            acc.mismatches.push((run.total, c));
        }
    }
    if let Some(k) = counters {
        add_counters(acc.counters.get_or_insert_with(ProbeCounters::default), &k);
    }
}

fn add_counters(t: &mut ProbeCounters, k: &ProbeCounters) {
    *t += k;
}

/// `a − b`, field by field (counters of one session read at two moments).
fn sub_counters(a: &ProbeCounters, b: &ProbeCounters) -> ProbeCounters {
    let mut d = ProbeCounters {
        seen: a.seen - b.seen,
        emitted: a.emitted - b.emitted,
        aggregated: a.aggregated - b.aggregated,
        ..Default::default()
    };
    for ((d, a), b) in d.dropped_by_reason.iter_mut().zip(a.dropped_by_reason).zip(b.dropped_by_reason) {
        *d = a - b;
    }
    d
}

/// The cgroup v2 id of this process (its children's, the workers', too).
fn own_cgroup_id() -> Result<u64> {
    use std::os::unix::fs::MetadataExt as _;
    use tracer_agent::proc;
    let root = proc::cgroup2_mount(Path::new("/proc")).context("no cgroup2 mount")?;
    let rel = proc::cgroup2_path(Path::new("/proc"), std::process::id()).context("no cgroup v2 path")?;
    let dir = root.join(rel.trim_start_matches('/'));
    Ok(std::fs::metadata(&dir).with_context(|| format!("stat {}", dir.display()))?.ino())
}

/// On the agent's thread: drain until everything emitted has been received (at most 3 s), then
/// the kernel counters and the launches the agent's CUDA snapshot counted for `tgid` (its
/// `CUDA_COUNTS` rows, read with `source::cuda_counts::read`).
fn settle(agent: &mut Agent, sink: &mut dyn FnMut(&Event, &EventContext), tgid: u32) -> (KernelCounters, u64) {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        agent.drain(sink);
        let (_, acc) = agent.accounting();
        if acc.in_flight <= 0 || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let kc = agent.accounting().0;
    let launches = agent.snapshot().cuda.processes.iter().filter(|p| p.tgid == tgid).map(|p| p.usage.launches).sum();
    (kc, launches)
}

/// One agent session on one library: the agent as production runs it (`pipeline::Agent`), with
/// only the cuda family and `cuda_libraries` = that library. A run in count mode, then one with
/// per-event mode switched on for this cgroup (as `profile` does, at run time).
fn agent_session(
    ctx: &Ctx,
    sec: &CudaSection,
    lib: &LibInfo,
    count: &mut CudaMeasured,
    per_event: Option<&mut CudaMeasured>,
    form: (CudaAttach, CudaEntryPrograms),
) -> Result<()> {
    let cfg = Config {
        families: Families { driver: false, lifecycle: false, cuda: true },
        cuda_libraries: vec![lib.path.clone()],
        cuda_attach: form.0,
        cuda_entry_programs: form.1,
        ..agent_config(ctx, AttachMode::Auto)
    };
    // Each uprobe aya attaches is one fd of this process (its perf event or its BPF link).
    let before = sys::attachment_fds();
    let running = agent_run::start(cfg, 0)?;
    let uprobes = sys::attachment_fds().saturating_sub(before);
    ctx.note_ours();
    let r = (|| -> Result<()> {
        if let Some(p) = &running.started.cuda_problem {
            bail!("cuda family not attached: {p}");
        }
        let (launch, placed) = running.with_agent(|a, _| {
            let r = a.report();
            let launch = r
                .cuda_libraries
                .iter()
                .flat_map(|r| r.entries.iter())
                .find(|e| e.symbol == SYMBOL)
                .map(|e| (e.status, e.detail.clone()));
            (launch, r.cuda_libraries.iter().map(|l| l.uprobes).sum::<usize>())
        })?;
        let links = uprobes;
        match launch {
            Some(("attached", _)) => {}
            Some((status, detail)) => bail!("{SYMBOL} not attached: {status} {detail}"),
            None => bail!("{SYMBOL} not in the attach report"),
        }
        (count.uprobes, count.links) = (placed, links);
        let call = counter_name();
        let run = run_worker(ctx, sec, &lib.path)?;
        let pid = run.pid;
        let (kc, launches) = running.with_agent(move |a, sink| settle(a, sink, pid))?;
        record(ctx, count, &run, Some(launches), Some(kc.get(call)));
        let Some(pe) = per_event else { return Ok(()) };
        (pe.uprobes, pe.links) = (placed, links);
        let cg = own_cgroup_id()?;
        running.with_agent(move |a, _| a.set_per_event(&[cg], &[]))?.context("switching per-event mode on")?;
        let run2 = run_worker(ctx, sec, &lib.path);
        let off = running.with_agent(|a, _| a.set_per_event(&[], &[]));
        let run2 = run2?;
        off?.context("switching per-event mode off")?;
        let pid = run2.pid;
        let (kc2, launches2) = running.with_agent(move |a, sink| settle(a, sink, pid))?;
        record(ctx, pe, &run2, Some(launches2), Some(sub_counters(&kc2.get(call), &kc.get(call))));
        let name = probe::NAMES[probe::CUDA_LAUNCH as usize];
        add_counters(
            pe.launch_counters.get_or_insert_with(ProbeCounters::default),
            &sub_counters(&kc2.get(name), &kc.get(name)),
        );
        let events = running.launch_events.lock().map(|m| m.get(&pid).copied().unwrap_or(0)).unwrap_or(0);
        *pe.events.get_or_insert(0) += events;
        if events != run2.total {
            pe.event_mismatches.push((run2.total, events));
        }
        Ok(())
    })();
    let t = Instant::now();
    let fin = running.finish();
    count.detach_s.push(t.elapsed().as_secs_f64());
    r?;
    fin?;
    Ok(())
}

/// One configuration on one library for one round (the agent's session fills two rows).
fn measure_one(
    ctx: &Ctx,
    sec: &CudaSection,
    lib: &LibInfo,
    probe: CudaProbe,
    acc: &mut CudaMeasured,
    per_event: Option<&mut CudaMeasured>,
) -> Result<()> {
    match probe {
        CudaProbe::None => {
            let run = run_worker(ctx, sec, &lib.path)?;
            record(ctx, acc, &run, None, None);
        }
        CudaProbe::Agent => agent_session(ctx, sec, lib, acc, per_event, (CudaAttach::Auto, CudaEntryPrograms::Auto))?,
        CudaProbe::AgentPerf => {
            agent_session(ctx, sec, lib, acc, None, (CudaAttach::PerfEvent, CudaEntryPrograms::Auto))?
        }
        CudaProbe::AgentPerEntry => {
            agent_session(ctx, sec, lib, acc, None, (CudaAttach::PerfEvent, CudaEntryPrograms::PerEntry))?
        }
        CudaProbe::PerEvent => bail!("measured in the agent's session"),
        CudaProbe::Symbol => {
            let e = symbol_probe(&lib.path)?;
            ctx.note_ours();
            (acc.uprobes, acc.links) = (1, 1);
            let r = run_worker(ctx, sec, &lib.path);
            let counts = r.as_ref().ok().map(|r| kernel_counts(&e, r.pid));
            let t = Instant::now();
            drop(e);
            acc.detach_s.push(t.elapsed().as_secs_f64());
            let (c, k) = counts.transpose()?.unzip();
            record(ctx, acc, &r?, c, k);
        }
        CudaProbe::Bpftrace => {
            let program = crate::bpftrace::cuda_program(&lib.path.display().to_string());
            let (r, n) = crate::bpftrace::while_attached_program(ctx, &program, || run_worker(ctx, sec, &lib.path))?;
            (acc.uprobes, acc.links) = (1, 1);
            record(ctx, acc, &r, Some(n), None);
        }
    }
    Ok(())
}

fn threads_run(ctx: &Ctx, lib: &Path, calls: u64, cpus: &str) -> Result<ThreadsRun> {
    let lines = ctx.worker(&["cuda-threads".into(), lib.display().to_string(), calls.to_string(), cpus.to_string()])?;
    let v = values(&lines, "threads");
    let Some([wall, calls, threads, failed, cpu]) = v.first().map(Vec::as_slice) else {
        bail!("worker printed no threads result");
    };
    Ok(ThreadsRun {
        wall_ns: *wall as u64,
        calls: *calls as u64,
        threads: *threads as usize,
        failed: *failed as u64,
        cpu_ns: *cpu as u64,
        total: first(&lines, "total").context("worker printed no total")? as u64,
        agent: None,
    })
}

/// 5b: two launching threads against the push variant, without and with the agent (production
/// configuration: every family, `cuda_libraries` = that library).
fn throughput(ctx: &Ctx, sec: &mut CudaSection) {
    let lib = sec.libs.iter().find(|l| l.short == "push").map(|l| l.path.clone());
    let cpus: Vec<usize> = (0..2).map(|i| i % ctx.machine.nproc.max(1)).collect();
    let cpu_list = cpus.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
    sec.throughput_cpus = cpus;
    let mut rows: Vec<ThroughputRow> =
        [false, true].into_iter().map(|with_agent| ThroughputRow { with_agent, result: Ok(vec![]) }).collect();
    let Some(lib) = lib else {
        for r in rows.iter_mut() {
            r.result = Err("the fake push variant is missing".into());
        }
        sec.throughput = rows;
        return;
    };
    for round in 0..sec.throughput_rounds {
        progress(&format!("5b: round {}/{}", round + 1, sec.throughput_rounds));
        for row in rows.iter_mut() {
            let Ok(acc) = &mut row.result else { continue };
            let r = if row.with_agent {
                (|| -> Result<ThreadsRun> {
                    let cfg = Config {
                        families: Families::default(),
                        cuda_libraries: vec![lib.clone()],
                        ..agent_config(ctx, AttachMode::Auto)
                    };
                    let running = agent_run::start(cfg, 0)?;
                    ctx.note_ours();
                    if let Some(p) = running.started.cuda_problem.clone() {
                        let _ = running.finish();
                        bail!("cuda family not attached: {p}");
                    }
                    let r = threads_run(ctx, &lib, sec.per_thread_calls, &cpu_list);
                    let outcome = running.finish()?;
                    let mut r = r?;
                    r.agent = Some(outcome);
                    Ok(r)
                })()
            } else {
                threads_run(ctx, &lib, sec.per_thread_calls, &cpu_list)
            };
            match r {
                Ok(r) => acc.push(r),
                Err(e) => row.result = Err(format!("{e:#}")),
            }
        }
    }
    sec.throughput = rows;
}

pub fn section(ctx: &Ctx) -> CudaSection {
    let o = &ctx.opts;
    let mut sec = CudaSection {
        libs: libraries(),
        rows: vec![],
        throughput: vec![],
        throughput_cpus: vec![],
        per_thread_calls: o.cuda_launches,
        warmup: if o.quick { 500 } else { 2_000 },
        target_ms: if o.quick { 20 } else { 100 },
        min_calls: if o.quick { 500 } else { 2_000 },
        max_calls: 2_000_000,
        // Three by default: each round detaches the agent's ~35 uprobes per library (seconds each).
        rounds: o.cuda_runs.unwrap_or(o.runs.min(3)),
        throughput_rounds: o.runs.min(3),
        skipped: None,
        detach: vec![],
    };
    for (i, l) in sec.libs.iter().enumerate() {
        for probe in PROBES {
            let mut result = Ok(CudaMeasured::default());
            if !l.path.is_file() {
                result = Err(format!("{} is missing", l.path.display()));
            } else if probe == CudaProbe::Bpftrace && o.no_bpftrace {
                result = Err("--no-bpftrace".into());
            } else if probe == CudaProbe::Bpftrace && !crate::bpftrace::available() {
                result = Err("bpftrace not installed".into());
            }
            sec.rows.push(CudaRow { lib: i, probe, result });
        }
    }
    for round in 0..sec.rounds {
        progress(&format!("5: round {}/{}", round + 1, sec.rounds));
        for idx in 0..sec.rows.len() {
            let (lib, probe) = (sec.rows[idx].lib, sec.rows[idx].probe);
            if probe == CudaProbe::PerEvent {
                continue; // measured in the agent's session
            }
            let mut acc = match &sec.rows[idx].result {
                Ok(a) => a.clone(),
                Err(_) => continue,
            };
            let pe_idx = (probe == CudaProbe::Agent)
                .then(|| sec.rows.iter().position(|r| r.lib == lib && r.probe == CudaProbe::PerEvent))
                .flatten();
            let mut pe = pe_idx.and_then(|i| sec.rows[i].result.as_ref().ok().cloned());
            let (n, n_pe) = (acc.runs.len(), pe.as_ref().map_or(0, |p| p.runs.len()));
            // A round that fails (bpftrace not exiting in time, say) is noted and the next round
            // tries again; a row with no successful round says why.
            if let Err(e) = measure_one(ctx, &sec, &sec.libs[lib], probe, &mut acc, pe.as_mut()) {
                let e = format!("{e:#}");
                progress(&format!("5: {} {probe:?}: {e}", sec.libs[lib].short));
                if acc.runs.len() == n {
                    acc.failures.push(e.clone());
                }
                if let Some(p) = pe.as_mut().filter(|p| p.runs.len() == n_pe) {
                    p.failures.push(e);
                }
            }
            if let (Some(i), Some(pe)) = (pe_idx, pe) {
                sec.rows[i].result = Ok(pe);
            }
            sec.rows[idx].result = Ok(acc);
        }
    }
    for row in sec.rows.iter_mut() {
        if let Ok(m) = &row.result
            && m.runs.is_empty()
            && let Some(e) = m.failures.first()
        {
            row.result = Err(e.clone());
        }
    }
    for row in sec.rows.iter_mut() {
        if let Ok(m) = &mut row.result {
            m.drop_dirty_rounds();
        }
    }
    throughput(ctx, &mut sec);
    sec.detach = detach::measure(&sec.libs, sec.rounds);
    sec
}

pub mod detach;
#[cfg(test)]
mod tests;
