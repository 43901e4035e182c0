//! The attribution snapshot as text: one block per GPU (or MIG instance) whose rows add up to the
//! device, readable at 80 columns on a 30-pod node.
//!
//! The percentages, energy and cost shown are split again at display precision with the same
//! largest-remainder rule as the engine, so the printed rows add up to the printed total exactly.
use comfy_table::{Cell, CellAlignment};

use crate::table::compact_table;
use tracer_core::attribution::{
    AttributionSnapshot, ContainerKey, ContainerSummary, GpuAttribution,
    attributor::suggests_smaller,
    format_currency_parts, format_fixed,
    gpu::{FULL, short_uuid},
    rightsizing::Fit,
    split::split_exact,
};
use tracer_core::format::{human_bytes, human_bytes_parts};

/// Width of everything in a table row but the name (columns, padding, borders).
const FIXED_COLUMNS: usize = 49;
/// Width of a name in a footnote.
const FOOTNOTE_NAME: usize = 26;
const NS_PER_HOUR: u128 = 3_600_000_000_000;

/// Cut `s` to `width` characters (an ellipsis marks the cut).
fn cut(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(width.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

fn container_name(name: Option<&str>, key: ContainerKey) -> String {
    name.map(str::to_string).unwrap_or_else(|| format!("cgroup #{}", key.0))
}

/// `values` split again so the shown units (`total` of them) add up; `None` where a value is absent.
fn shown(total: u64, values: &[Option<u64>]) -> Vec<Option<u64>> {
    let w: Vec<u128> = values.iter().map(|v| v.unwrap_or(0) as u128).collect();
    let parts = split_exact(total, &w).unwrap_or_else(|| vec![0; values.len()]);
    values.iter().zip(parts).map(|(v, p)| v.map(|_| p)).collect()
}

/// Tenths of a percent as `12.3%`.
fn pct(tenths: u64) -> String {
    format!("{}.{}%", tenths / 10, tenths % 10)
}

/// Cost per hour at this interval's rate, in cents (integer), from nano-currency over `interval_ns`.
fn cents_per_hour(nano: u64, interval_ns: u64) -> u64 {
    if interval_ns == 0 {
        return 0;
    }
    let v = nano as u128 * NS_PER_HOUR / interval_ns as u128;
    ((v + 5_000_000) / 10_000_000).min(u64::MAX as u128) as u64
}

fn dash() -> Cell {
    Cell::new("-").set_alignment(CellAlignment::Right)
}

fn right(s: String) -> Cell {
    Cell::new(s).set_alignment(CellAlignment::Right)
}

/// Markers of one container: `!` idle reservation, `↓` something smaller would fit.
fn markers(s: Option<&ContainerSummary>) -> String {
    let Some(s) = s else { return String::new() };
    let mut m = String::new();
    if s.idle_reservation.is_some() {
        m.push('!');
    }
    if s.rightsizing.as_ref().is_some_and(suggests_smaller) {
        m.push('↓');
    }
    m
}

fn fit_text(f: &Fit) -> String {
    match f {
        Fit::MigProfile { profile } => format!("MIG {profile}"),
        Fit::Fraction { pct } => format!("{pct}% of a GPU"),
        Fit::WholeGpu => "a whole GPU".into(),
    }
}

fn request_text(r: &tracer_core::attribution::GpuRequest) -> String {
    use tracer_core::attribution::GpuRequest::*;
    match r {
        WholeGpus { count } => format!("asked {count} GPU"),
        MigProfile { profile, count } => format!("asked {count}× {profile}"),
        Fraction { fraction } => format!("asked {:.0}%", fraction * 100.0),
    }
}

fn name_width(width: u16) -> usize {
    (width as usize).saturating_sub(FIXED_COLUMNS).clamp(12, 60)
}

fn basis_str(b: tracer_core::attribution::gpu::CostBasis) -> &'static str {
    use tracer_core::attribution::gpu::CostBasis::*;
    match b {
        MemoryTime => "memory-time",
        ComputeTime => "compute-time",
        Blended => "blended",
        RequestBased => "requests",
        Nothing => "nothing to split by",
    }
}

fn energy_str(e: tracer_core::attribution::input::EnergySource) -> &'static str {
    use tracer_core::attribution::input::EnergySource::*;
    match e {
        Counter => "counter",
        CounterReset => "counter (reset)",
        PowerTimesInterval => "power × time",
        ParentShare => "GPU's × slices",
    }
}

fn duration(s: u64) -> String {
    if s < 120 {
        format!("{s} s")
    } else if s < 7200 {
        format!("{} min", s / 60)
    } else {
        format!("{} h", s / 3600)
    }
}

fn gpu_title(g: &GpuAttribution) -> String {
    let idx = g.index.map(|i| format!("GPU {i}")).unwrap_or_else(|| "GPU ?".into());
    let what = match &g.mig_profile {
        Some(p) => format!("{idx} MIG {p} {}", short_uuid(&g.uuid)),
        None => format!("{idx} {}", short_uuid(&g.uuid)),
    };
    match &g.name {
        Some(n) => format!("{what} · {n}"),
        None => what,
    }
}

fn gpu_notes(g: &GpuAttribution) -> Vec<&'static str> {
    let mut n = Vec::new();
    if let Some(m) = &g.memory {
        if m.scaled_down {
            n.push("process memory > used: scaled down");
        }
        if m.inconsistent {
            n.push("NVML memory figures disagree");
        }
    } else {
        n.push("no memory reading");
    }
    if g.compute.clamped {
        n.push("SM samples > 100%: scaled down");
    }
    if g.compute.method == tracer_core::attribution::gpu::ComputeMethod::LaunchCounts
        && g.compute.device_activity_pct.is_none()
    {
        n.push("SM% = share of launches, idle unknown");
    }
    n
}

/// One GPU's block.
fn render_gpu(s: &AttributionSnapshot, g: &GpuAttribution, width: u16, out: &mut String) {
    let w = width as usize;
    out.push_str(&cut(&gpu_title(g), w));
    out.push('\n');
    out.push_str(&cut(&format!("{}: {}", g.sharing.as_str(), g.sharing_reason), w));
    out.push('\n');
    let cost_basis = g.cost.map_or("no price", |c| basis_str(c.basis));
    let energy_src = g.energy.map_or("none", |e| energy_str(e.source));
    let mut line = format!("SM split: {} · energy: {} · cost: {}", g.compute.method.as_str(), energy_src, cost_basis);
    for n in gpu_notes(g) {
        line.push_str(" · ");
        line.push_str(n);
    }
    out.push_str(&cut(&line, w));
    out.push('\n');

    let n = g.containers.len();
    // Rows: containers..., driver_reserved, unattributed, idle, free.
    let mem_vals: Vec<Option<u64>> = match &g.memory {
        Some(m) => g
            .containers
            .iter()
            .map(|c| Some(c.memory_bytes))
            .chain([Some(m.driver_reserved), Some(m.unattributed), None, Some(m.free)])
            .collect(),
        None => vec![None; n + 4],
    };
    let mem_pct = shown(if g.memory.is_some_and(|m| m.total > 0) { 1000 } else { 0 }, &mem_vals);
    let sm_vals: Vec<Option<u64>> = g
        .containers
        .iter()
        .map(|c| Some(c.sm_millipct as u64))
        .chain([None, Some(g.compute.unattributed as u64), Some(g.compute.idle as u64), None])
        .collect();
    let sm_pct = shown(1000, &sm_vals);
    let (energy_total, energy) = match &g.energy {
        Some(e) => {
            let vals: Vec<Option<u64>> = g
                .containers
                .iter()
                .map(|c| c.energy_mj)
                .chain([None, Some(e.unattributed), Some(e.idle), None])
                .collect();
            // Tenths of a joule, rounded half up.
            let t = e.delta_mj / 100 + u64::from(e.delta_mj % 100 >= 50);
            (Some(t), shown(t, &vals))
        }
        None => (None, vec![None; n + 4]),
    };
    let (cost_total, cost) = match &g.cost {
        Some(c) => {
            let vals: Vec<Option<u64>> = g
                .containers
                .iter()
                .map(|l| l.cost_nano)
                .chain([Some(c.driver_reserved), Some(c.unattributed), Some(c.idle), None])
                .collect();
            let t = cents_per_hour(c.price_nano, s.interval_ns);
            (Some(t), shown(t, &vals))
        }
        None => (None, vec![None; n + 4]),
    };

    let mut table = compact_table(width, vec!["", "CONTAINER", "MEMORY", "MEM%", "SM%", "ENERGY J", "COST/h"]);
    let summaries =
        |k: ContainerKey| s.containers.binary_search_by_key(&k, |c| c.container).ok().map(|i| &s.containers[i]);
    let fmt_pct = |v: Option<u64>| v.map_or_else(dash, |t| right(pct(t)));
    let fmt_energy = |v: Option<u64>| v.map_or_else(dash, |t| right(format!("{}.{}", t / 10, t % 10)));
    let fmt_cost = |v: Option<u64>| v.map_or_else(dash, |c| right(format_fixed(c.saturating_mul(10_000_000), 2)));
    // One unit and precision for the column, the rows split from the printed total.
    let total_mem = g.memory.map(|m| m.total);
    let (mem_total_shown, mem_shown) = human_bytes_parts(total_mem.unwrap_or(0), &mem_vals);
    let mem_cell = |i: usize| mem_shown[i].clone().map_or_else(dash, right);
    for (i, c) in g.containers.iter().enumerate() {
        table.add_row(vec![
            Cell::new(markers(summaries(c.container))),
            Cell::new(cut(&container_name(c.name.as_deref(), c.container), name_width(width))),
            mem_cell(i),
            fmt_pct(mem_pct[i]),
            fmt_pct(sm_pct[i]),
            fmt_energy(energy[i]),
            fmt_cost(cost[i]),
        ]);
    }
    for (j, label) in ["driver_reserved", "unattributed", "idle", "free"].iter().enumerate() {
        let i = n + j;
        table.add_row(vec![
            Cell::new(""),
            Cell::new(*label),
            mem_cell(i),
            fmt_pct(mem_pct[i]),
            fmt_pct(sm_pct[i]),
            fmt_energy(energy[i]),
            fmt_cost(cost[i]),
        ]);
    }
    table.add_row(vec![
        Cell::new(""),
        Cell::new("total"),
        total_mem.map_or_else(dash, |_| right(mem_total_shown)),
        fmt_pct(total_mem.map(|t| if t > 0 { 1000 } else { 0 })),
        fmt_pct(Some(FULL as u64 / 100)),
        fmt_energy(energy_total),
        fmt_cost(cost_total),
    ]);
    out.push_str(&crate::table::render(&table));
    out.push('\n');
}

/// Render a snapshot for a terminal `width` columns wide.
pub fn render_attribution(s: &AttributionSnapshot, width: u16) -> String {
    let w = width as usize;
    let mut out = String::new();
    let secs = s.interval_ns as f64 / 1e9;
    let price = match s.price_per_gpu_hour {
        Some(p) => format!("price {p:.2}/GPU-h"),
        None => "no price configured (attribution.price_per_gpu_hour)".into(),
    };
    out.push_str(&cut(&format!("attribution over {secs:.1} s · {} GPU(s) · {price}", s.gpus.len()), w));
    out.push('\n');
    if s.price_per_gpu_hour.is_some() {
        let b = &s.bill;
        let containers: u64 = s.containers.iter().map(|c| c.cumulative_cost_nano).sum::<u64>() + b.evicted;
        // One precision for the whole line, parts split from the printed total: what a person
        // adds up is what is printed.
        let (total, parts) = format_currency_parts(b.total, &[containers, b.idle, b.driver_reserved, b.unattributed]);
        out.push_str(&cut(&format!("bill so far {total} = containers {}", parts[0]), w));
        out.push('\n');
        out.push_str(&cut(
            &format!("  + idle {} + driver reserved {} + unattributed {}", parts[1], parts[2], parts[3]),
            w,
        ));
        out.push('\n');
    }
    for g in &s.gpus {
        out.push('\n');
        render_gpu(s, g, width, &mut out);
    }
    // Footnotes: one line per flagged container.
    let flagged: Vec<&ContainerSummary> = s.containers.iter().filter(|c| !markers(Some(c)).is_empty()).collect();
    if !flagged.is_empty() {
        out.push('\n');
    }
    for c in flagged {
        let name = cut(&container_name(c.name.as_deref(), c.container), FOOTNOTE_NAME);
        if let Some(r) = &c.idle_reservation {
            let idle_s = (s.start_unix_ns + s.interval_ns).saturating_sub(r.since_unix_ns) / 1_000_000_000;
            let line = format!("! {name}: holds {}, ran nothing for {}", human_bytes(r.held_bytes), duration(idle_s));
            out.push_str(&cut(&line, w));
            out.push('\n');
        }
        if let Some(r) = c.rightsizing.as_ref().filter(|r| suggests_smaller(r)) {
            let asked = r.request.as_ref().map(|q| format!(" ({})", request_text(q))).unwrap_or_default();
            let line = format!(
                "↓ {name}: peak {}, SM {} → {}{asked}",
                human_bytes(r.peak_memory_bytes),
                pct(r.peak_sm_millipct as u64 / 100),
                fit_text(&r.fit)
            );
            out.push_str(&cut(&line, w));
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests;
