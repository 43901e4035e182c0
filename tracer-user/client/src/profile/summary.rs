//! What a profiling session found, in numbers (after Holistic Trace Analysis's sections): the top
//! kernels, the launch rate over time, memory over the window with its peak, allocations not freed
//! (leak candidates), allocation churn, idle gaps where nothing was submitted, what is known and
//! not known of GPU-side time, and the session's own cost. JSON for scripts, text for people.
use std::{
    collections::{BTreeMap, HashMap},
    fmt::Write as _,
};

use serde::Serialize;

use super::{
    intervals::{Bounded, Gap, bounded_intervals, idle_gaps, union_ns},
    perfetto::TraceStats,
};
use tracer_core::profile::{MemoryKind, Recording, Target};

/// Kernels listed in the top-kernels table.
const TOP_KERNELS: usize = 20;
/// Leak candidates and idle gaps listed (the counts cover them all).
const LISTED: usize = 20;

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    /// `pid N` or `cgroup N`.
    pub target: String,
    /// The workload as a person reads it (`ns/pod/container`, `pid 4242 (python)`).
    pub workload: String,
    pub window: Window,
    pub processes: Vec<ProcessRow>,
    pub launches: Launches,
    pub top_kernels: Vec<KernelRow>,
    /// The kernels with the most bounded time (see [`KernelRow::bounded_ms`]): an estimate of
    /// where the GPU's time went, not a measurement.
    pub top_kernels_by_bounded_time: Vec<KernelRow>,
    pub launch_rate: LaunchRate,
    pub cuda_memory: MemorySummary,
    pub driver_memory: MemorySummary,
    /// CUDA allocations made in the window and not freed by its end (the newest first), with
    /// their count and bytes.
    pub leak_candidates: Vec<Leak>,
    pub leak_candidates_total: u64,
    pub leak_candidates_bytes: u64,
    pub idle: Idle,
    pub gpu_time: GpuTime,
    /// Host time blocked in synchronisation, per thread (most first).
    pub synchronisation: Vec<SyncRow>,
    /// `cuEventQuery` calls (polling) and how many found the event not ready.
    pub event_queries: u64,
    pub event_queries_not_ready: u64,
    /// Copies per direction (`htod`, `dtoh`, `dtod`, `any`), and memsets.
    pub copies: BTreeMap<String, CopyRow>,
    pub memsets: CopyRow,
    /// NVML's readings of the GPUs the workload used (every GPU when NVML lists none of its
    /// processes), over the window.
    pub gpus: Vec<tracer_core::profile::gpus::GpuRow>,
    pub session: Session,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SyncRow {
    pub tgid: u32,
    pub tid: u32,
    pub calls: u64,
    pub blocked_ms: f64,
    pub longest_ms: f64,
    /// Calls per entry point.
    pub per_entry_point: BTreeMap<String, u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CopyRow {
    pub calls: u64,
    pub bytes: u64,
    pub async_calls: u64,
    /// Host time inside the calls (for synchronous ones, the copy itself).
    pub host_ms: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Window {
    pub start_ktime_ns: u64,
    pub end_ktime_ns: u64,
    pub duration_s: f64,
    /// `duration`, `signal`, `workload exited`, `event limit`.
    pub ended_by: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ProcessRow {
    pub tgid: u32,
    pub name: String,
    pub threads: usize,
    pub launches: u64,
    pub cuda_allocs: u64,
    pub cuda_frees: u64,
    /// Launches the in-kernel counts saw in the window (count-mode batches), for comparison.
    pub counted_launches: u64,
    pub exited_at_s: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Launches {
    pub total: u64,
    pub per_entry_point: BTreeMap<String, u64>,
    pub per_stream: BTreeMap<String, u64>,
    /// Launches of functions whose name lookup was not seen (before the session, standalone).
    pub unnamed: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct KernelRow {
    pub name: String,
    pub launches: u64,
    /// Its share of the launches.
    pub share: f64,
    /// Bounded time apportioned to it: each bounded interval's length split equally among the
    /// launches it bounds. Kernels are not timed; this says where the bounded time could have
    /// gone if every kernel in an interval took as long as the others.
    pub bounded_ms: f64,
    /// Its share of all the bounded time so apportioned.
    pub bounded_share: f64,
    /// The grid and block of its most frequent shape, `XxYxZ`.
    pub grid: String,
    pub block: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LaunchRate {
    pub bucket_s: f64,
    /// Launches in each bucket from the window's start.
    pub per_bucket: Vec<u64>,
    pub mean_per_s: f64,
    pub peak_per_s: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct MemorySummary {
    pub allocs: u64,
    pub failed_allocs: u64,
    pub alloc_bytes: u64,
    pub frees: u64,
    pub freed_bytes: u64,
    /// What the workload's processes held when the window began, from the agent's ledgers
    /// (`profile --connect`); `None` when not known (a standalone session: its probes start with
    /// it). The counters of the trace start at this level.
    pub held_at_start_bytes: Option<u64>,
    /// Allocated minus freed over the window.
    pub net_bytes: i64,
    /// The highest level the window reached, relative to its start, and when.
    pub peak_bytes: i64,
    pub peak_at_s: f64,
    /// That peak as a level held: `held_at_start_bytes` + `peak_bytes` (when the start is known).
    pub peak_held_bytes: Option<u64>,
    /// Allocations per second over the window (churn).
    pub allocs_per_s: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Leak {
    pub tgid: u32,
    pub tid: u32,
    pub entry_point: String,
    pub ptr: String,
    pub bytes: u64,
    pub at_s: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Idle {
    pub min_gap_ms: f64,
    pub gaps: u64,
    /// Sum over processes of their idle time, and its share of (processes × window).
    pub total_s: f64,
    pub share: f64,
    /// The longest gaps.
    pub longest: Vec<GapRow>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GapRow {
    pub tgid: u32,
    pub start_s: f64,
    pub duration_ms: f64,
}

/// What is known of when kernels ran on the GPU. Uprobes see submissions only: a kernel is known
/// to have run within [its launch, the return of a synchronisation that began after it]
/// ([`Bounded`]); nothing else about its timing is.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GpuTime {
    /// Launches a synchronisation in the window bounded, and those none did.
    pub launches_bounded: u64,
    pub launches_not_bounded: u64,
    /// The share of the window (per process, averaged) covered by bounded intervals: the GPU ran
    /// those kernels somewhere inside it. The rest of the window is unknown.
    pub bounded_share: f64,
    pub unknown_share: f64,
    pub intervals: u64,
    pub note: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Session {
    /// `standalone` (the profiler's own probes) or `agent ADDR`.
    pub source: String,
    /// What the session's probes cost the workload, estimated from the benchmark.
    pub estimated_cost: Cost,
    /// What the reader should know about the recording.
    pub notes: Vec<String>,
    pub events_seen: u64,
    pub events_kept: u64,
    pub events_over_limit: u64,
    pub tracer_dropped: u64,
    pub trace: TraceStats,
}

/// What recording cost the workload's threads, estimated from the per-call costs the benchmark
/// measured (`docs/benchmarks.md`), not measured in this session.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Cost {
    /// Per launch in per-event mode (§5, real libcuda 535, placed probes).
    pub per_launch_ns: u64,
    /// Per timed call (synchronisation, event, copy, memset) in a session (§13).
    pub per_timed_call_ns: u64,
    pub launches: u64,
    pub timed_calls: u64,
    /// launches × per_launch_ns + timed_calls × per_timed_call_ns, in ms of the workload's CPU time.
    pub total_ms: f64,
    /// That, as a share of the window's wall time summed over the workload's processes (one busy
    /// thread each).
    pub share_of_window: f64,
    pub basis: String,
}

/// §5's per-event launch Δ on the real libcuda (docs/benchmarks.md, 2-vCPU VM).
const BENCH_PER_LAUNCH_NS: u64 = 1830;
/// §13's timed-call Δ in a session (cuEventQuery / cuStreamSynchronize on the fake).
const BENCH_PER_TIMED_CALL_NS: u64 = 1637;

/// Bounded time per kernel name: each interval's length split equally among the launches it
/// bounds (the launches of its stream from its start, as many as it counts).
fn bounded_ns_per_kernel<'a>(rec: &'a Recording, bounded: &[Bounded]) -> HashMap<&'a str, f64> {
    let mut per_stream: BTreeMap<(u32, u64), Vec<(u64, &str)>> = BTreeMap::new();
    for l in &rec.launches {
        per_stream.entry((l.tgid, l.stream)).or_default().push((l.ktime_ns, &l.name));
    }
    for v in per_stream.values_mut() {
        v.sort_by_key(|(t, _)| *t);
    }
    let mut pos: HashMap<(u32, u64), usize> = HashMap::new();
    let mut out: HashMap<&str, f64> = HashMap::new();
    for b in bounded {
        let key = (b.tgid, b.stream);
        let Some(v) = per_stream.get(&key) else { continue };
        let p = pos.entry(key).or_default();
        let from = *p + v[*p..].partition_point(|(t, _)| *t < b.start_ktime_ns);
        let to = (from + b.kernels as usize).min(v.len());
        let each = b.end_ktime_ns.saturating_sub(b.start_ktime_ns) as f64 / b.kernels.max(1) as f64;
        for (_, name) in &v[from..to] {
            *out.entry(name).or_default() += each;
        }
        *p = to;
    }
    out
}

/// A launch's (grid, block).
type Shape = ([u32; 3], [u32; 3]);

fn secs(rec: &Recording, t: u64) -> f64 {
    t.saturating_sub(rec.start_ktime_ns) as f64 / 1e9
}

fn shape(v: [u32; 3]) -> String {
    format!("{}x{}x{}", v[0], v[1], v[2])
}

/// The summary of `rec`, with the trace's statistics.
pub fn summarize(rec: &Recording, target: &Target, idle_gap_ns: u64, trace: TraceStats) -> Summary {
    let duration_ns = rec.end_ktime_ns.saturating_sub(rec.start_ktime_ns);
    let duration_s = duration_ns as f64 / 1e9;
    let mut s = Summary {
        target: target.describe(),
        workload: rec.workload.clone(),
        window: Window {
            start_ktime_ns: rec.start_ktime_ns,
            end_ktime_ns: rec.end_ktime_ns,
            duration_s,
            ended_by: rec.ended_by.clone(),
        },
        ..Default::default()
    };

    // Launches, per kernel with its most frequent shape.
    let mut kernels: HashMap<&str, (u64, HashMap<Shape, u64>)> = HashMap::new();
    let bucket_ns = 1_000_000_000u64;
    let buckets = duration_ns.div_ceil(bucket_ns).max(1) as usize;
    let mut per_bucket = vec![0u64; buckets];
    // Counted by the launch's own fields, named once at the end (not a String per launch).
    let mut per_entry_point: HashMap<&str, u64> = HashMap::new();
    let mut per_stream: HashMap<u64, u64> = HashMap::new();
    for l in &rec.launches {
        s.launches.total += 1;
        *per_entry_point.entry(&l.entry_point).or_default() += 1;
        *per_stream.entry(l.stream).or_default() += 1;
        s.launches.unnamed += u64::from(!l.named);
        let k = kernels.entry(&l.name).or_default();
        k.0 += 1;
        *k.1.entry((l.grid, l.block)).or_default() += 1;
        let b = (l.ktime_ns.saturating_sub(rec.start_ktime_ns) / bucket_ns) as usize;
        per_bucket[b.min(buckets - 1)] += 1;
    }
    for (entry_point, n) in per_entry_point {
        *s.launches.per_entry_point.entry(entry_point.to_string()).or_default() += n;
    }
    for (stream, n) in per_stream {
        *s.launches.per_stream.entry(super::perfetto::stream_name(stream)).or_default() += n;
    }
    let (bounded, not_bounded) = bounded_intervals(rec);
    let bounded_ns = bounded_ns_per_kernel(rec, &bounded);
    let bounded_total: f64 = bounded_ns.values().sum();
    let mut rows: Vec<KernelRow> = kernels
        .into_iter()
        .map(|(name, (n, shapes))| {
            let ((grid, block), _) =
                shapes.into_iter().max_by_key(|(sh, c)| (*c, std::cmp::Reverse(*sh))).unwrap_or_default();
            let ns = bounded_ns.get(name).copied().unwrap_or(0.0);
            KernelRow {
                name: name.to_string(),
                launches: n,
                share: n as f64 / s.launches.total.max(1) as f64,
                bounded_ms: ns / 1e6,
                bounded_share: if bounded_total > 0.0 { ns / bounded_total } else { 0.0 },
                grid: shape(grid),
                block: shape(block),
            }
        })
        .collect();
    let mut by_time: Vec<KernelRow> = rows.iter().filter(|k| k.bounded_ms > 0.0).cloned().collect();
    by_time.sort_by(|a, b| b.bounded_ms.total_cmp(&a.bounded_ms).then_with(|| a.name.cmp(&b.name)));
    by_time.truncate(TOP_KERNELS);
    s.top_kernels_by_bounded_time = by_time;
    rows.sort_by(|a, b| b.launches.cmp(&a.launches).then_with(|| a.name.cmp(&b.name)));
    rows.truncate(TOP_KERNELS);
    s.top_kernels = rows;
    s.launch_rate = LaunchRate {
        bucket_s: bucket_ns as f64 / 1e9,
        mean_per_s: if duration_s > 0.0 { s.launches.total as f64 / duration_s } else { 0.0 },
        peak_per_s: per_bucket.iter().copied().max().unwrap_or(0) as f64,
        per_bucket,
    };

    // Memory: each ledger's level over the window, allocations not freed.
    let mut live: HashMap<(u32, u64), usize> = HashMap::new();
    let (mut cuda_level, mut driver_level) = (0i64, 0i64);
    let mut calls: Vec<&tracer_core::profile::MemoryCall> = rec.memory.iter().collect();
    calls.sort_by_key(|m| m.ktime_ns);
    for (i, m) in calls.iter().enumerate() {
        let (sum, level) = match m.kind {
            MemoryKind::CudaAlloc | MemoryKind::CudaFree => (&mut s.cuda_memory, &mut cuda_level),
            MemoryKind::DriverAlloc | MemoryKind::DriverFree => (&mut s.driver_memory, &mut driver_level),
        };
        match m.kind {
            MemoryKind::CudaAlloc | MemoryKind::DriverAlloc => {
                if !m.success {
                    sum.failed_allocs += 1;
                    continue;
                }
                sum.allocs += 1;
                sum.alloc_bytes += m.bytes;
                *level += m.bytes as i64;
                if m.kind == MemoryKind::CudaAlloc && m.ptr != 0 {
                    live.insert((m.tgid, m.ptr), i);
                }
            }
            MemoryKind::CudaFree | MemoryKind::DriverFree => {
                sum.frees += 1;
                sum.freed_bytes += m.bytes;
                *level -= m.bytes as i64;
                if m.kind == MemoryKind::CudaFree {
                    live.remove(&(m.tgid, m.ptr));
                }
            }
        }
        if *level > sum.peak_bytes {
            sum.peak_bytes = *level;
            sum.peak_at_s = secs(rec, m.ktime_ns);
        }
    }
    let held = |f: fn(&tracer_core::profile::HeldAtStart) -> u64| {
        rec.held_at_start
            .as_ref()
            .map(|h| h.iter().filter(|(tgid, _)| rec.processes.contains_key(tgid)).map(|(_, h)| f(h)).sum::<u64>())
    };
    for (sum, level, start) in [
        (&mut s.cuda_memory, cuda_level, held(|h| h.cuda_bytes)),
        (&mut s.driver_memory, driver_level, held(|h| h.driver_bytes)),
    ] {
        sum.net_bytes = level;
        sum.allocs_per_s = if duration_s > 0.0 { sum.allocs as f64 / duration_s } else { 0.0 };
        sum.held_at_start_bytes = start;
        sum.peak_held_bytes = start.map(|h| (h as i64 + sum.peak_bytes).max(0) as u64);
    }
    // A process's allocations die with it: only the living ones' are leak candidates.
    let mut leaks: Vec<&tracer_core::profile::MemoryCall> = live
        .values()
        .map(|&i| calls[i])
        .filter(|m| rec.processes.get(&m.tgid).is_none_or(|p| p.exited_ktime_ns.is_none()))
        .collect();
    leaks.sort_by(|a, b| b.ktime_ns.cmp(&a.ktime_ns).then(a.ptr.cmp(&b.ptr)));
    s.leak_candidates_total = leaks.len() as u64;
    s.leak_candidates_bytes = leaks.iter().map(|m| m.bytes).sum();
    s.leak_candidates = leaks
        .iter()
        .take(LISTED)
        .map(|m| Leak {
            tgid: m.tgid,
            tid: m.tid,
            entry_point: m.entry_point.clone(),
            ptr: format!("{:#x}", m.ptr),
            bytes: m.bytes,
            at_s: secs(rec, m.ktime_ns),
        })
        .collect();

    // Idle gaps.
    let gaps = idle_gaps(rec, idle_gap_ns);
    let idle_ns: u64 = gaps.iter().map(|g| g.end_ktime_ns - g.start_ktime_ns).sum();
    let mut longest: Vec<&Gap> = gaps.iter().collect();
    longest.sort_by_key(|g| std::cmp::Reverse(g.end_ktime_ns - g.start_ktime_ns));
    s.idle = Idle {
        min_gap_ms: idle_gap_ns as f64 / 1e6,
        gaps: gaps.len() as u64,
        total_s: idle_ns as f64 / 1e9,
        share: idle_ns as f64 / (duration_ns.max(1) as f64 * rec.processes.len().max(1) as f64),
        longest: longest
            .iter()
            .take(LISTED)
            .map(|g| GapRow {
                tgid: g.tgid,
                start_s: secs(rec, g.start_ktime_ns),
                duration_ms: (g.end_ktime_ns - g.start_ktime_ns) as f64 / 1e6,
            })
            .collect(),
    };
    let covered: u64 = rec
        .processes
        .keys()
        .map(|t| {
            union_ns(bounded.iter().filter(|b| b.tgid == *t).map(|b| (b.start_ktime_ns, b.end_ktime_ns)).collect())
        })
        .sum();
    let bounded_share = (covered as f64 / (duration_ns.max(1) as f64 * rec.processes.len().max(1) as f64)).min(1.0);
    s.gpu_time = GpuTime {
        launches_bounded: rec.launches.len() as u64 - not_bounded,
        launches_not_bounded: not_bounded,
        bounded_share,
        unknown_share: 1.0 - bounded_share,
        intervals: bounded.len() as u64,
        note: "uprobes see when kernels are submitted, not when they run: a kernel ran within [its launch, \
               the return of a stream or context synchronisation that began after it] (drawn on the stream \
               tracks as \"ran within (bounded at sync)\"); no kernel duration is measured"
            .into(),
    };

    // Synchronisation per thread, queries, copies, memsets.
    let mut sync: BTreeMap<(u32, u32), SyncRow> = BTreeMap::new();
    for c in &rec.calls {
        let ms = (c.end_ktime_ns - c.start_ktime_ns) as f64 / 1e6;
        match c.class.as_str() {
            "synchronize" => {
                let r = sync.entry((c.tgid, c.tid)).or_insert_with(|| SyncRow {
                    tgid: c.tgid,
                    tid: c.tid,
                    ..Default::default()
                });
                r.calls += 1;
                r.blocked_ms += ms;
                r.longest_ms = r.longest_ms.max(ms);
                *r.per_entry_point.entry(c.entry_point.clone()).or_default() += 1;
            }
            "query" => {
                s.event_queries += 1;
                // CUDA_ERROR_NOT_READY
                s.event_queries_not_ready += u64::from(c.result == 600);
            }
            "copy" | "memset" => {
                let row =
                    if c.class == "copy" { s.copies.entry(c.direction.clone()).or_default() } else { &mut s.memsets };
                row.calls += 1;
                row.bytes += c.bytes;
                row.async_calls += u64::from(c.is_async);
                row.host_ms += ms;
            }
            _ => {}
        }
    }
    s.synchronisation = sync.into_values().collect();
    s.synchronisation.sort_by(|a, b| b.blocked_ms.total_cmp(&a.blocked_ms).then(a.tid.cmp(&b.tid)));

    for (&tgid, p) in &rec.processes {
        let mine = |k: MemoryKind| rec.memory.iter().filter(|m| m.tgid == tgid && m.kind == k).count() as u64;
        s.processes.push(ProcessRow {
            tgid,
            name: p.display_name(tgid),
            threads: p.threads.len(),
            launches: rec.launches.iter().filter(|l| l.tgid == tgid).count() as u64,
            cuda_allocs: mine(MemoryKind::CudaAlloc),
            cuda_frees: mine(MemoryKind::CudaFree),
            counted_launches: rec.counted_launches.get(&tgid).copied().unwrap_or(0),
            exited_at_s: p.exited_ktime_ns.map(|t| secs(rec, t)),
        });
    }
    s.gpus = tracer_core::profile::gpus::rows(rec);
    let mut notes = rec.notes.clone();
    if !rec.gpu_samples.is_empty() && tracer_core::profile::gpus::used_gpus(rec).is_none() {
        notes.push("NVML lists none of the workload's processes on any GPU: every GPU's readings are shown".into());
    }
    let (launches, timed_calls) = (rec.launches.len() as u64, rec.calls.len() as u64);
    let total_ms = (launches * BENCH_PER_LAUNCH_NS + timed_calls * BENCH_PER_TIMED_CALL_NS) as f64 / 1e6;
    let wall_ms = duration_ns as f64 / 1e6 * rec.processes.len().max(1) as f64;
    let estimated_cost = Cost {
        per_launch_ns: BENCH_PER_LAUNCH_NS,
        per_timed_call_ns: BENCH_PER_TIMED_CALL_NS,
        launches,
        timed_calls,
        total_ms,
        share_of_window: if wall_ms > 0.0 { total_ms / wall_ms } else { 0.0 },
        basis: "an estimate: the calls recorded times the per-call cost docs/benchmarks.md measured on a 2-vCPU VM \
                (section 5: a launch in per-event mode on the real libcuda 535, placed probes; section 13: a \
                timed call in a session), not measured in this session; count mode, which the agent runs anyway, \
                is part of the launch figure"
            .into(),
    };
    s.session = Session {
        source: rec.source.clone(),
        estimated_cost,
        notes,
        events_seen: rec.events_seen,
        events_kept: rec.events_seen - rec.events_over_limit,
        events_over_limit: rec.events_over_limit,
        tracer_dropped: rec.tracer_dropped,
        trace,
    };
    s
}

fn bytes(b: i64) -> String {
    let a = b.unsigned_abs() as f64;
    let sign = if b < 0 { "-" } else { "" };
    if a >= (1u64 << 30) as f64 {
        format!("{sign}{:.2} GiB", a / (1u64 << 30) as f64)
    } else if a >= (1u64 << 20) as f64 {
        format!("{sign}{:.1} MiB", a / (1u64 << 20) as f64)
    } else if a >= 1024.0 {
        format!("{sign}{:.1} KiB", a / 1024.0)
    } else {
        format!("{sign}{a} B")
    }
}

/// The summary for a terminal.
pub fn render(s: &Summary) -> String {
    let mut o = String::new();
    let who = if s.workload.is_empty() { s.target.clone() } else { format!("{} ({})", s.workload, s.target) };
    let _ = writeln!(o, "profile of {who}: {:.1} s, ended by {}", s.window.duration_s, s.window.ended_by);
    for p in &s.processes {
        let exited = p.exited_at_s.map(|t| format!(", exited at {t:.2} s")).unwrap_or_default();
        let _ = writeln!(
            o,
            "  {} ({} threads): {} launches ({} counted in the kernel), {} CUDA allocations, {} frees{exited}",
            p.name, p.threads, p.launches, p.counted_launches, p.cuda_allocs, p.cuda_frees
        );
    }
    let _ = writeln!(
        o,
        "\nlaunches: {} ({:.0}/s mean, {:.0}/s peak){}",
        s.launches.total,
        s.launch_rate.mean_per_s,
        s.launch_rate.peak_per_s,
        if s.launches.unnamed > 0 {
            format!("; {} of unnamed functions (their lookups happened before the session)", s.launches.unnamed)
        } else {
            String::new()
        }
    );
    if !s.top_kernels.is_empty() {
        let _ = writeln!(o, "  {:>9}  {:>6}  {:<14} {:<12} kernel", "launches", "share", "grid", "block");
        for k in &s.top_kernels {
            let _ = writeln!(
                o,
                "  {:>9}  {:>5.1}%  {:<14} {:<12} {}",
                k.launches,
                k.share * 100.0,
                k.grid,
                k.block,
                k.name
            );
        }
    }
    if !s.top_kernels_by_bounded_time.is_empty() {
        let _ = writeln!(
            o,
            "by bounded time (each bounded interval split equally among its launches; an estimate, kernels are not timed):"
        );
        let _ = writeln!(o, "  {:>11}  {:>6}  {:>9}  kernel", "bounded ms", "share", "launches");
        for k in &s.top_kernels_by_bounded_time {
            let _ = writeln!(
                o,
                "  {:>11.3}  {:>5.1}%  {:>9}  {}",
                k.bounded_ms,
                k.bounded_share * 100.0,
                k.launches,
                k.name
            );
        }
    }
    let _ = writeln!(o);
    for (name, m) in [("CUDA", &s.cuda_memory), ("driver", &s.driver_memory)] {
        let held = match (m.held_at_start_bytes, m.peak_held_bytes) {
            (Some(h), Some(p)) => format!("held {} at the start, {} at the peak; ", bytes(h as i64), bytes(p as i64)),
            _ => String::new(),
        };
        let _ = writeln!(
            o,
            "{name} memory: {held}{} allocations ({}, {} failed, {:.1}/s), {} frees ({}); net {}, peak {} above the start at {:.2} s",
            m.allocs,
            bytes(m.alloc_bytes as i64),
            m.failed_allocs,
            m.allocs_per_s,
            m.frees,
            bytes(m.freed_bytes as i64),
            bytes(m.net_bytes),
            bytes(m.peak_bytes),
            m.peak_at_s
        );
    }
    let _ = writeln!(
        o,
        "{}",
        if s.cuda_memory.held_at_start_bytes.is_some() {
            "memory counters start at what each process held when the session began (the agent's ledgers)"
        } else {
            "memory counters start at 0: the window's allocations and frees only (a standalone session's probes began \
             with it, so what the process held before is not known; profile --connect to a running agent starts them \
             at the level held)"
        }
    );
    let _ = writeln!(
        o,
        "leak candidates (allocated in the window, not freed): {} ({})",
        s.leak_candidates_total,
        bytes(s.leak_candidates_bytes as i64)
    );
    for l in &s.leak_candidates {
        let _ = writeln!(
            o,
            "  {} {} by thread {} at {:.2} s: {}",
            l.entry_point,
            l.ptr,
            l.tid,
            l.at_s,
            bytes(l.bytes as i64)
        );
    }
    let _ = writeln!(
        o,
        "\nidle (no launch for >= {} ms): {} gaps, {:.2} s, {:.1}% of the window",
        s.idle.min_gap_ms,
        s.idle.gaps,
        s.idle.total_s,
        s.idle.share * 100.0
    );
    let g = &s.gpu_time;
    let _ = writeln!(
        o,
        "GPU time: {} launches bounded at a synchronisation, {} not; the bounds cover {:.1}% of the window, \
         the rest is unknown (kernel durations are not measured)",
        g.launches_bounded,
        g.launches_not_bounded,
        g.bounded_share * 100.0,
    );
    for r in &s.synchronisation {
        let _ = writeln!(
            o,
            "  thread {} blocked {:.2} ms in {} synchronisations (longest {:.2} ms)",
            r.tid, r.blocked_ms, r.calls, r.longest_ms
        );
    }
    if s.event_queries > 0 {
        let _ =
            writeln!(o, "  cuEventQuery: {} calls, {} not ready (polling)", s.event_queries, s.event_queries_not_ready);
    }
    for (dir, c) in
        s.copies.iter().map(|(d, c)| (d.as_str(), c)).chain((s.memsets.calls > 0).then_some(("memset", &s.memsets)))
    {
        let _ = writeln!(
            o,
            "  {dir}: {} calls ({} async), {}, {:.2} ms on the host",
            c.calls,
            c.async_calls,
            bytes(c.bytes as i64),
            c.host_ms
        );
    }
    if !s.gpus.is_empty() {
        let _ = writeln!(o, "\nGPUs (NVML, {} passes):", s.gpus.iter().map(|g| g.samples).max().unwrap_or(0));
        let opt = |v: Option<f64>, unit: &str| v.map_or("-".to_string(), |v| format!("{v:.1}{unit}"));
        for g in &s.gpus {
            let _ = writeln!(
                o,
                "  GPU {} {}: utilization mean {} (peak {}), this workload's SM {}, power {}, memory used peak {}{}",
                g.index,
                g.name,
                opt(g.utilization_mean_pct, "%"),
                g.utilization_peak_pct.map_or("-".into(), |p| format!("{p}%")),
                opt(g.workload_sm_mean_pct, "%"),
                opt(g.power_mean_w, " W"),
                g.memory_used_peak_bytes.map_or("-".into(), |b| bytes(b as i64)),
                g.workload_memory_peak_bytes.map_or(String::new(), |b| format!(" (this workload {})", bytes(b as i64))),
            );
        }
    }
    let t = &s.session.trace;
    let _ = writeln!(
        o,
        "\nsession: {} events kept, {} over the event limit, {} dropped by the tracer; trace {} in {} packets{}",
        s.session.events_kept,
        s.session.events_over_limit,
        s.session.tracer_dropped,
        bytes(t.bytes as i64),
        t.packets,
        if t.packets_over_limit > 0 {
            format!(" ({} packets left out at the size limit)", t.packets_over_limit)
        } else {
            String::new()
        }
    );
    let c = &s.session.estimated_cost;
    let _ = writeln!(
        o,
        "estimated cost to the workload: {:.2} ms of CPU ({:.3}% of the window): {} launches x {} ns + {} timed \
         calls x {} ns (per-call costs from docs/benchmarks.md, not measured here)",
        c.total_ms,
        c.share_of_window * 100.0,
        c.launches,
        c.per_launch_ns,
        c.timed_calls,
        c.per_timed_call_ns
    );
    if !s.session.source.is_empty() {
        let _ = writeln!(o, "source: {}", s.session.source);
    }
    for n in &s.session.notes {
        let _ = writeln!(o, "note: {n}");
    }
    o
}
