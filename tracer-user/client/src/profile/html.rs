//! The HTML report of a session: one self-contained file (uPlot and its CSS inlined, the data as
//! JSON in the page; nothing is fetched when it is opened) with plots of memory over the window,
//! launches per second, the top kernels, the host time blocked in synchronisation per thread and
//! NVML's utilization of the GPUs the workload used, and a table beside each plot with the numbers
//! it draws.
use std::fmt::Write as _;

use serde::Serialize;

use super::summary::Summary;
use tracer_core::profile::{MemoryKind, Recording, gpus};

const UPLOT_JS: &str = include_str!("vendor/uplot/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("vendor/uplot/uPlot.min.css");
/// Kernels in the top-kernels plot.
const TOP: usize = 15;
/// Points of the launch-rate plot, about.
const RATE_POINTS: u64 = 200;

/// What the page's script plots.
#[derive(Serialize, Default)]
struct Plots {
    /// Seconds from the window's start; CUDA and driver ledger levels after each change, MiB.
    memory: [Vec<f64>; 3],
    /// Bucket starts (s) and launches per second in each.
    rate: [Vec<f64>; 2],
    rate_bucket_ms: f64,
    /// Top kernels: names and launches.
    kernels: (Vec<String>, Vec<u64>),
    /// Threads (`tid`) and the milliseconds each blocked in synchronisation.
    sync: (Vec<String>, Vec<f64>),
    /// NVML: seconds of each pass, then per GPU shown its utilization % and this workload's SM %
    /// (null where a pass had no reading); `gpu_labels` names those series in order.
    gpu: Vec<Vec<Option<f64>>>,
    gpu_labels: Vec<String>,
}

/// Series colours of the NVML plot, per GPU: utilization, then the workload's SM % (the first
/// GPU's are what the Chromium test looks for).
const GPU_COLOURS: [(&str, &str); 4] =
    [("#8c564b", "#e377c2"), ("#17becf", "#bcbd22"), ("#7f7f7f", "#aec7e8"), ("#ff9896", "#c5b0d5")];

fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

const MIB: f64 = (1u64 << 20) as f64;

fn plots(rec: &Recording, s: &Summary) -> Plots {
    let mut p = Plots::default();
    let secs = |t: u64| t.saturating_sub(rec.start_ktime_ns) as f64 / 1e9;
    let duration = secs(rec.end_ktime_ns);
    // Memory: each ledger's level relative to the window's start, after every change.
    let mut calls: Vec<&tracer_core::profile::MemoryCall> = rec.memory.iter().collect();
    calls.sort_by_key(|m| m.ktime_ns);
    let (mut cuda, mut driver) = (0i64, 0i64);
    let mut push = |t: f64, c: i64, d: i64| {
        p.memory[0].push(t);
        p.memory[1].push(c as f64 / MIB);
        p.memory[2].push(d as f64 / MIB);
    };
    push(0.0, 0, 0);
    for m in calls {
        let b = m.bytes as i64;
        match m.kind {
            MemoryKind::CudaAlloc if m.success => cuda += b,
            MemoryKind::CudaFree => cuda -= b,
            MemoryKind::DriverAlloc if m.success => driver += b,
            MemoryKind::DriverFree => driver -= b,
            _ => continue,
        }
        push(secs(m.ktime_ns), cuda, driver);
    }
    push(duration, cuda, driver);
    // Launch rate in about RATE_POINTS buckets (at least 10 ms).
    let window = rec.end_ktime_ns.saturating_sub(rec.start_ktime_ns).max(1);
    let bucket = (window / RATE_POINTS).max(10_000_000);
    let n = window.div_ceil(bucket) as usize;
    let last = n.max(1) - 1;
    let mut counts = vec![0u64; last + 1];
    for l in &rec.launches {
        let i = (l.ktime_ns.saturating_sub(rec.start_ktime_ns) / bucket) as usize;
        counts[i.min(last)] += 1;
    }
    p.rate_bucket_ms = bucket as f64 / 1e6;
    for (i, c) in counts.iter().enumerate() {
        p.rate[0].push(i as f64 * bucket as f64 / 1e9);
        p.rate[1].push(*c as f64 * 1e9 / bucket as f64);
    }
    for k in s.top_kernels.iter().take(TOP) {
        p.kernels.0.push(k.name.clone());
        p.kernels.1.push(k.launches);
    }
    for r in &s.synchronisation {
        p.sync.0.push(format!("{} ({})", r.tid, r.tgid));
        p.sync.1.push(r.blocked_ms);
    }
    // NVML: one x per pass (the passes of all GPUs share their time), two series per GPU.
    let shown = gpus::shown(rec);
    let times: std::collections::BTreeSet<u64> = shown.iter().map(|g| g.ktime_ns).collect();
    let indices: std::collections::BTreeSet<u32> = shown.iter().map(|g| g.index).collect();
    if !times.is_empty() {
        let at: std::collections::BTreeMap<u64, usize> = times.iter().enumerate().map(|(i, t)| (*t, i)).collect();
        p.gpu.push(times.iter().map(|t| Some(secs(*t))).collect());
        for index in &indices {
            let (mut util, mut sm) = (vec![None; times.len()], vec![None; times.len()]);
            for g in shown.iter().filter(|g| g.index == *index) {
                util[at[&g.ktime_ns]] = g.gpu_pct.map(f64::from);
                sm[at[&g.ktime_ns]] = gpus::workload_share(rec, g).0.map(f64::from);
            }
            p.gpu.push(util);
            p.gpu.push(sm);
            p.gpu_labels.push(format!("GPU {index} utilization %"));
            p.gpu_labels.push(format!("GPU {index} SM % of this workload"));
        }
    }
    p
}

/// One plot's place: a heading, the chart (or a line saying there is nothing to draw) and its table.
fn section(o: &mut String, id: &str, title: &str, has_data: bool, table: &str) {
    section_or(o, id, title, has_data, "Nothing recorded in the window.", table)
}

/// [`section`] with its own line for when there is nothing to draw.
fn section_or(o: &mut String, id: &str, title: &str, has_data: bool, empty: &str, table: &str) {
    let _ = write!(o, "<section><h2>{}</h2>", esc(title));
    if has_data {
        let _ = write!(o, "<div class=\"plot\" id=\"{id}\"></div>");
    } else {
        let _ = write!(o, "<p class=\"empty\">{}</p>", esc(empty));
    }
    let _ = write!(
        o,
        "<details{}><summary>Table</summary>{table}</details></section>",
        if has_data { "" } else { " open" }
    );
}

fn table(head: &[&str], rows: impl Iterator<Item = Vec<String>>) -> String {
    let mut t = String::from("<table><thead><tr>");
    for h in head {
        let _ = write!(t, "<th>{}</th>", esc(h));
    }
    t.push_str("</tr></thead><tbody>");
    for r in rows {
        t.push_str("<tr>");
        for c in r {
            let _ = write!(t, "<td>{}</td>", esc(&c));
        }
        t.push_str("</tr>");
    }
    t.push_str("</tbody></table>");
    t
}

/// The report of `rec` (summarised as `s`).
pub fn render(rec: &Recording, s: &Summary) -> String {
    let p = plots(rec, s);
    // In a <script>, "</" would end it early: JSON allows "<\/" for the same string.
    let data = serde_json::to_string(&p).expect("plain data serializes").replace("</", "<\\/");
    let mut o = String::new();
    let who = if s.workload.is_empty() { s.target.clone() } else { format!("{} ({})", s.workload, s.target) };
    let _ = write!(
        o,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>gpu-tracer profile: {}</title>\
         <style>{UPLOT_CSS}{STYLE}</style></head><body><h1>gpu-tracer profile: {}</h1>",
        esc(&who),
        esc(&who)
    );
    let g = &s.gpu_time;
    let blocked: f64 = s.synchronisation.iter().map(|r| r.blocked_ms).sum();
    let _ = write!(
        o,
        "<p class=\"meta\">{:.1} s window, ended by {}; {} process{}. Uprobes see when work is submitted, \
         not when it runs: {} of {} launches are bounded at a synchronisation, covering {:.1}% of the \
         window; the rest is unknown.</p><ul class=\"cards\">\
         <li><b>{}</b> launches</li><li><b>{:.0}</b> launches/s peak</li>\
         <li><b>{:.1} MiB</b> {}</li><li><b>{}</b> leak candidates</li>\
         <li><b>{:.1} ms</b> blocked in synchronisation</li><li><b>{}</b> events dropped</li></ul>",
        s.window.duration_s,
        esc(&s.window.ended_by),
        s.processes.len(),
        if s.processes.len() == 1 { "" } else { "es" },
        g.launches_bounded,
        s.launches.total,
        g.bounded_share * 100.0,
        s.launches.total,
        s.launch_rate.peak_per_s,
        s.cuda_memory.peak_held_bytes.map_or(s.cuda_memory.peak_bytes as f64, |b| b as f64) / MIB,
        match s.cuda_memory.held_at_start_bytes {
            Some(h) => format!("CUDA held at the peak ({:.1} MiB at the start)", h as f64 / MIB),
            None => "CUDA peak above the window's start".into(),
        },
        s.leak_candidates_total,
        blocked,
        s.session.tracer_dropped + s.session.events_over_limit,
    );
    let mem_rows = (0..p.memory[0].len()).map(|i| {
        vec![format!("{:.3}", p.memory[0][i]), format!("{:.2}", p.memory[1][i]), format!("{:.2}", p.memory[2][i])]
    });
    section(
        &mut o,
        "memory",
        "Memory allocated in the window (MiB, relative to its start)",
        p.memory[0].len() > 2,
        &table(&["time (s)", "CUDA ledger (MiB)", "driver ledger (MiB)"], mem_rows),
    );
    let rate_rows = (0..p.rate[0].len()).map(|i| vec![format!("{:.3}", p.rate[0][i]), format!("{:.0}", p.rate[1][i])]);
    section(
        &mut o,
        "rate",
        &format!("Launches per second ({:.0} ms buckets)", p.rate_bucket_ms),
        !rec.launches.is_empty(),
        &table(&["bucket start (s)", "launches/s"], rate_rows),
    );
    let kernel_rows = s.top_kernels.iter().take(TOP).map(|k| {
        vec![
            k.name.clone(),
            k.launches.to_string(),
            format!("{:.1}%", k.share * 100.0),
            format!("{:.3}", k.bounded_ms),
            format!("{:.1}%", k.bounded_share * 100.0),
            k.grid.clone(),
            k.block.clone(),
        ]
    });
    section(
        &mut o,
        "kernels",
        "Top kernels by launches",
        !p.kernels.0.is_empty(),
        &table(
            &[
                "kernel",
                "launches",
                "share",
                "bounded ms (estimate: each bounded interval split equally among its launches)",
                "bounded share",
                "grid",
                "block",
            ],
            kernel_rows,
        ),
    );
    let sync_rows = s.synchronisation.iter().map(|r| {
        vec![
            r.tid.to_string(),
            r.tgid.to_string(),
            r.calls.to_string(),
            format!("{:.3}", r.blocked_ms),
            format!("{:.3}", r.longest_ms),
        ]
    });
    section(
        &mut o,
        "sync",
        "Host time blocked in synchronisation, per thread (ms)",
        !p.sync.0.is_empty(),
        &table(&["thread", "process", "calls", "blocked (ms)", "longest (ms)"], sync_rows),
    );
    let shown = gpus::shown(rec);
    let gpu_rows = shown.iter().map(|g| {
        let (sm, mem) = gpus::workload_share(rec, g);
        let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
        vec![
            format!("{:.3}", g.ktime_ns.saturating_sub(rec.start_ktime_ns) as f64 / 1e9),
            g.index.to_string(),
            opt(g.gpu_pct.map(|v| v.to_string())),
            opt(sm.map(|v| v.to_string())),
            opt(g.power_mw.map(|v| format!("{:.1}", f64::from(v) / 1e3))),
            opt(g.memory_used_bytes.map(|v| format!("{:.1}", v as f64 / MIB))),
            opt(mem.map(|v| format!("{:.1}", v as f64 / MIB))),
            opt(g.sm_clock_mhz.map(|v| v.to_string())),
        ]
    });
    section_or(
        &mut o,
        "gpu",
        "GPU utilization (NVML), the GPUs this workload used (%)",
        !p.gpu.is_empty(),
        "No NVML readings in the window: NVML was not loaded (see the summary's session notes) or its first \
         pass came after the window.",
        &table(
            &[
                "time (s)",
                "GPU",
                "utilization %",
                "workload SM %",
                "power (W)",
                "memory used (MiB)",
                "workload memory (MiB)",
                "SM clock (MHz)",
            ],
            gpu_rows,
        ),
    );
    let leak_rows = s.leak_candidates.iter().map(|l| {
        vec![l.ptr.clone(), l.bytes.to_string(), l.entry_point.clone(), l.tid.to_string(), format!("{:.3}", l.at_s)]
    });
    let _ = write!(
        o,
        "<section><h2>Leak candidates: {} ({} bytes), allocated in the window and not freed</h2>{}</section>",
        s.leak_candidates_total,
        s.leak_candidates_bytes,
        table(&["pointer", "bytes", "entry point", "thread", "at (s)"], leak_rows)
    );
    let colours = serde_json::to_string(&GPU_COLOURS).expect("plain data serializes");
    let _ = write!(
        o,
        "<script>{UPLOT_JS}</script><script>const DATA = {data};\nconst GPU_COLOURS = {colours};\n{SCRIPT}</script></body></html>"
    );
    o
}

const STYLE: &str = "body{font-family:sans-serif;margin:24px;max-width:1100px;color:#222}\
h2{font-size:1.05em;margin-top:28px}.meta{color:#555}.plot{min-height:300px}\
.cards{display:flex;flex-wrap:wrap;gap:10px;padding:0;list-style:none}\
.cards li{border:1px solid #ccc;border-radius:6px;padding:8px 12px}.empty{color:#888}\
table{border-collapse:collapse;font-size:0.85em;margin-top:6px}\
td,th{border:1px solid #ddd;padding:2px 8px;text-align:right}td:first-child{text-align:left}";

/// Draws the five plots from `DATA`. Each series has its own colour (the Chromium test looks for
/// them in a screenshot).
const SCRIPT: &str = r##"
const W = Math.min(1050, document.body.clientWidth || 1050);
function plot(id, opts, data) {
  const el = document.getElementById(id);
  if (el) new uPlot(Object.assign({width: W, height: 280}, opts), data, el);
}
const bars = uPlot.paths.bars({size: [0.6, 60]});
plot("memory", {
  scales: {x: {time: false}},
  axes: [{label: "seconds"}, {label: "MiB"}],
  series: [{label: "s"},
    {label: "CUDA ledger", stroke: "#1f77b4", width: 2, paths: uPlot.paths.stepped({align: 1})},
    {label: "driver ledger", stroke: "#ff7f0e", width: 2, paths: uPlot.paths.stepped({align: 1})}],
}, DATA.memory);
plot("rate", {
  scales: {x: {time: false}},
  axes: [{label: "seconds"}, {label: "launches/s"}],
  series: [{label: "s"}, {label: "launches/s", stroke: "#d62728", fill: "rgba(214,39,40,0.15)", width: 2}],
}, DATA.rate);
function categories(id, names, values, colour, unit) {
  plot(id, {
    scales: {x: {time: false, range: [-0.5, names.length - 0.5]}},
    axes: [{values: (u, ticks) => ticks.map(i => Number.isInteger(i) && names[i] ? names[i].slice(0, 24) : ""),
            splits: () => names.map((_, i) => i), rotate: -30, size: 80}, {label: unit}],
    series: [{label: "#"}, {label: unit, stroke: colour, fill: colour, paths: bars, points: {show: false}}],
  }, [names.map((_, i) => i), values]);
}
categories("kernels", DATA.kernels[0], DATA.kernels[1], "#2ca02c", "launches");
categories("sync", DATA.sync[0], DATA.sync[1], "#9467bd", "ms blocked");
if (DATA.gpu.length > 1) {
  plot("gpu", {
    scales: {x: {time: false}, y: {range: [0, 100]}},
    axes: [{label: "seconds"}, {label: "%"}],
    series: [{label: "s"}].concat(DATA.gpu_labels.map((label, i) => ({
      // The GPU's utilization as a wide band, the workload's SM % a thin line over it (equal when
      // the workload is all the GPU does: both stay visible).
      label, width: i % 2 ? 2 : 6, spanGaps: true,
      stroke: GPU_COLOURS[Math.floor(i / 2) % GPU_COLOURS.length][i % 2]}))),
  }, DATA.gpu);
}
"##;
