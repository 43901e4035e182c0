//! The attribution families: per GPU, the latest interval split into lines that add up to the
//! device (`attribution_*`, `gpu_sharing_info`); per container, cumulative energy and cost, idle
//! reservations and rightsizing (`container_*`); and the bill by line.
use std::{
    collections::{BTreeMap, HashMap},
    fmt,
};

use super::{
    ContainerLabels, GpuIdLabels, LabelSet, MetricEncoder, Scrape, Unit, counter_family, currency, gauge, gauge_family,
    joules, ratio_of_millipct,
};
use tracer_core::attribution::{SharingMode, attributor::suggests_smaller, gpu::ComputeMethod, rightsizing::Fit};

/// One line of a GPU's split: `line` is `container` (with the container labels) or a named
/// remainder (`driver_reserved`, `unattributed`, `free`, `idle`) with empty container labels, so
/// `sum by (gpu)` over a family is the device total.
struct GpuLineRef<'a> {
    gpu: &'a GpuIdLabels,
    line: &'static str,
    container: &'a ContainerLabels,
}

impl LabelSet for GpuLineRef<'_> {
    fn visit(&self, label: &mut dyn FnMut(&str, &str) -> fmt::Result) -> fmt::Result {
        self.gpu.visit(label)?;
        label("line", self.line)?;
        self.container.visit(label)
    }
}

/// Container labels interned per scrape: each cgroup resolved once, each distinct label set
/// stored once (cgroups that resolve to the same labels share an index, so they are summed).
struct Interned {
    labels: Vec<ContainerLabels>,
    by_labels: HashMap<ContainerLabels, usize>,
    by_cgroup: HashMap<u64, usize>,
}

impl Default for Interned {
    fn default() -> Self {
        Interned {
            labels: vec![ContainerLabels::default()],
            by_labels: HashMap::from([(ContainerLabels::default(), 0)]),
            by_cgroup: HashMap::new(),
        }
    }
}

impl Interned {
    fn of_cgroup(&mut self, s: &Scrape<'_>, cgroup_id: u64) -> usize {
        if let Some(&i) = self.by_cgroup.get(&cgroup_id) {
            return i;
        }
        let l = s.container_by_id(cgroup_id);
        let i = match self.by_labels.get(&l) {
            Some(&i) => i,
            None => {
                self.labels.push(l.clone());
                self.by_labels.insert(l, self.labels.len() - 1);
                self.labels.len() - 1
            }
        };
        self.by_cgroup.insert(cgroup_id, i);
        i
    }
}

/// Per GPU, a sharing mode and compute method (info-style, value 1).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct SharingLabels {
    gpu: GpuIdLabels,
    mode: &'static str,
    method: &'static str,
}

impl LabelSet for SharingLabels {
    fn visit(&self, label: &mut dyn FnMut(&str, &str) -> fmt::Result) -> fmt::Result {
        self.gpu.visit(label)?;
        label("mode", self.mode)?;
        label("method", self.method)
    }
}

fn sharing_mode_label(m: SharingMode) -> &'static str {
    match m {
        SharingMode::Exclusive => "exclusive",
        SharingMode::TimeSlicing => "time_slicing",
        SharingMode::Mps => "mps",
        SharingMode::Mig => "mig",
        SharingMode::Unknown => "unknown",
    }
}

fn compute_method_label(m: ComputeMethod) -> &'static str {
    match m {
        ComputeMethod::ProcessSamples => "process_samples",
        ComputeMethod::LaunchCounts => "launch_counts",
        ComputeMethod::None => "none",
    }
}

/// The latest interval's attribution: per GPU, memory, SM share, energy and cost split into lines
/// that add up to the device (and to the interval's price), the sharing mode, and each container's
/// launches. Nothing when attribution has not run.
pub fn attribution_lines(s: &Scrape<'_>, e: &mut dyn MetricEncoder) -> fmt::Result {
    let Some(a) = s.snapshot.attribution.as_deref() else {
        return Ok(());
    };
    // Aggregated by small keys (GPU index, line, interned container labels): comparing and
    // cloning the label strings for every (GPU, container, family) was most of a scrape's time.
    type Lines = BTreeMap<(usize, &'static str, usize), u64>;
    let (mut memory, mut sm, mut energy, mut cost, mut launches) =
        (Lines::new(), Lines::new(), Lines::new(), Lines::new(), Lines::new());
    let mut totals: BTreeMap<usize, u64> = BTreeMap::new();
    let mut sharing: BTreeMap<SharingLabels, u64> = BTreeMap::new();
    let mut gpus: Vec<GpuIdLabels> = Vec::with_capacity(a.gpus.len());
    // Index 0: the lines that belong to no container (empty container labels).
    let mut names = Interned::default();
    let add = |m: &mut Lines, gpu: usize, line: &'static str, c: usize, v: u64| {
        let slot = m.entry((gpu, line, c)).or_default();
        *slot = slot.saturating_add(v);
    };
    for (gi, g) in a.gpus.iter().enumerate() {
        let id = GpuIdLabels::new(&g.uuid, g.minor, g.mig_profile.as_deref());
        sharing.insert(
            SharingLabels {
                gpu: id.clone(),
                mode: sharing_mode_label(g.sharing),
                method: compute_method_label(g.compute.method),
            },
            1,
        );
        gpus.push(id);
        for c in &g.containers {
            let l = names.of_cgroup(s, c.container.0);
            add(&mut sm, gi, "container", l, c.sm_millipct as u64);
            add(&mut launches, gi, "container", l, c.launches);
            if g.memory.is_some() {
                add(&mut memory, gi, "container", l, c.memory_bytes);
            }
            if let Some(mj) = c.energy_mj {
                add(&mut energy, gi, "container", l, mj);
            }
            if let Some(n) = c.cost_nano {
                add(&mut cost, gi, "container", l, n);
            }
        }
        if let Some(m) = &g.memory {
            add(&mut memory, gi, "driver_reserved", 0, m.driver_reserved);
            add(&mut memory, gi, "unattributed", 0, m.unattributed);
            add(&mut memory, gi, "free", 0, m.free);
            let t = totals.entry(gi).or_default();
            *t = t.saturating_add(m.total);
        }
        add(&mut sm, gi, "unattributed", 0, g.compute.unattributed as u64);
        add(&mut sm, gi, "idle", 0, g.compute.idle as u64);
        if let Some(en) = &g.energy {
            add(&mut energy, gi, "unattributed", 0, en.unattributed);
            add(&mut energy, gi, "idle", 0, en.idle);
        }
        if let Some(k) = &g.cost {
            add(&mut cost, gi, "driver_reserved", 0, k.driver_reserved);
            add(&mut cost, gi, "unattributed", 0, k.unattributed);
            add(&mut cost, gi, "idle", 0, k.idle);
        }
    }
    let labels =
        |&(g, line, c): &(usize, &'static str, usize)| GpuLineRef { gpu: &gpus[g], line, container: &names.labels[c] };
    gauge_family(
        e,
        "gpu_sharing_info",
        "How each GPU is shared (mode) and how its SM time was split (method); value 1.",
        None,
        sharing,
    )?;
    gauge_family(
        e,
        "attribution_memory",
        "GPU memory by line: container lines + driver_reserved + unattributed + free = the GPU's total.",
        Some(Unit::Bytes),
        memory.iter().map(|(k, v)| (labels(k), *v)),
    )?;
    gauge_family(
        e,
        "attribution_memory_total",
        "GPU memory total the attribution lines add up to.",
        Some(Unit::Bytes),
        totals.iter().map(|(g, v)| (&gpus[*g], *v)),
    )?;
    gauge_family(
        e,
        "attribution_sm_share",
        "Share of the interval's SM time by line (container, unattributed, idle); sums to 1 per GPU.",
        Some(Unit::Ratio),
        sm.iter().map(|(k, v)| (labels(k), ratio_of_millipct(*v))),
    )?;
    gauge_family(
        e,
        "attribution_interval_energy",
        "GPU energy of the latest interval by line (container, unattributed, idle).",
        Some(Unit::Joules),
        energy.iter().map(|(k, v)| (labels(k), joules(*v))),
    )?;
    gauge_family(
        e,
        "attribution_interval_cost",
        "The GPU's price for the latest interval by line, in the price's currency.",
        None,
        cost.iter().map(|(k, v)| (labels(k), currency(*v))),
    )?;
    gauge_family(
        e,
        "attribution_interval_launches",
        "Kernel launches per container and GPU in the latest interval.",
        None,
        launches.iter().map(|(k, v)| (labels(k), *v)),
    )?;
    gauge(
        e,
        "attribution_interval",
        "Length of the latest attribution interval.",
        Some(Unit::Seconds),
        a.interval_ns as f64 / 1e9,
    )?;
    if let Some(p) = a.price_per_gpu_hour {
        gauge(e, "price_per_gpu_hour", "The price of one GPU for one hour, as applied to cost.", None, p)?;
    }
    Ok(())
}

/// Per container across GPUs: cumulative energy and cost, idle reservations and rightsizing.
pub fn container_totals(s: &Scrape<'_>, e: &mut dyn MetricEncoder) -> fmt::Result {
    let Some(a) = s.snapshot.attribution.as_deref() else {
        return Ok(());
    };
    #[derive(Default)]
    struct Acc {
        energy_mj: u64,
        cost_nano: u64,
        has_cost: bool,
        idle_bytes: Option<u64>,
        idle_since_ns: u64,
    }
    // Keyed by interned container labels (see `attribution_lines`).
    let mut names = Interned::default();
    let mut acc: BTreeMap<usize, Acc> = BTreeMap::new();
    // (container, fit, suggested, smaller) -> 1.
    let mut rightsizing: BTreeMap<(usize, &'static str, String, &'static str), u64> = BTreeMap::new();
    // (container, stat) -> (memory bytes, SM millipercent).
    let mut peaks: BTreeMap<(usize, &'static str), (u64, u64)> = BTreeMap::new();
    for c in &a.containers {
        let labels = names.of_cgroup(s, c.container.0);
        let x = acc.entry(labels).or_default();
        x.energy_mj = x.energy_mj.saturating_add(c.cumulative_energy_mj);
        x.cost_nano = x.cost_nano.saturating_add(c.cumulative_cost_nano);
        x.has_cost |= a.price_per_gpu_hour.is_some() || c.cumulative_cost_nano > 0;
        if let Some(r) = &c.idle_reservation {
            x.idle_bytes = Some(x.idle_bytes.unwrap_or(0).saturating_add(r.held_bytes));
            x.idle_since_ns = if x.idle_since_ns == 0 { r.since_unix_ns } else { x.idle_since_ns.min(r.since_unix_ns) };
        }
        if let Some(r) = &c.rightsizing {
            let (fit, suggested) = match &r.fit {
                Fit::MigProfile { profile } => ("mig_profile", profile.clone()),
                Fit::Fraction { pct } => ("fraction", format!("{pct}%")),
                Fit::WholeGpu => ("whole_gpu", "whole".to_owned()),
            };
            let smaller = if suggests_smaller(r) { "true" } else { "false" };
            rightsizing.insert((labels, fit, suggested, smaller), 1);
            for (stat, mem, sm) in
                [("peak", r.peak_memory_bytes, r.peak_sm_millipct), ("p95", r.p95_memory_bytes, r.p95_sm_millipct)]
            {
                let p = peaks.entry((labels, stat)).or_default();
                p.0 = p.0.max(mem);
                p.1 = p.1.max(sm as u64);
            }
        }
    }
    let l = |i: &usize| &names.labels[*i];
    counter_family(
        e,
        "container_energy",
        "GPU energy attributed to the container since it first appeared (its share of each GPU's energy).",
        Some(Unit::Joules),
        acc.iter().map(|(i, x)| (l(i), joules(x.energy_mj))),
    )?;
    counter_family(
        e,
        "container_cost",
        "Cost attributed to the container since it first appeared, in the price's currency.",
        None,
        acc.iter().filter(|(_, x)| x.has_cost).map(|(i, x)| (l(i), currency(x.cost_nano))),
    )?;
    gauge_family(
        e,
        "container_idle_reservation",
        "GPU memory held by a container that has run nothing for the configured time (only flagged containers).",
        Some(Unit::Bytes),
        acc.iter().filter_map(|(i, x)| Some((l(i), x.idle_bytes?))),
    )?;
    gauge_family(
        e,
        "container_idle_reservation_since_timestamp",
        "When a flagged container's idle reservation started (Unix time).",
        Some(Unit::Seconds),
        acc.iter().filter(|(_, x)| x.idle_bytes.is_some()).map(|(i, x)| (l(i), x.idle_since_ns as f64 / 1e9)),
    )?;
    gauge_family(
        e,
        "container_rightsizing_info",
        "What would fit the container's peak use with headroom (fit, suggested), and whether it is smaller; value 1.",
        None,
        rightsizing.iter().map(|((i, fit, suggested, smaller), v)| {
            ((l(i), [("fit", *fit), ("suggested", suggested.as_str()), ("smaller", *smaller)]), *v)
        }),
    )?;
    gauge_family(
        e,
        "container_rightsizing_memory",
        "Peak and p95 of the container's GPU memory over the rightsizing window, by stat.",
        Some(Unit::Bytes),
        peaks.iter().map(|((i, stat), (m, _))| ((l(i), [("stat", *stat)]), *m)),
    )?;
    gauge_family(
        e,
        "container_rightsizing_sm_share",
        "Peak and p95 of the container's SM share (of one GPU) over the rightsizing window, by stat.",
        Some(Unit::Ratio),
        peaks.iter().map(|((i, stat), (_, sm))| ((l(i), [("stat", *stat)]), ratio_of_millipct(*sm))),
    )
}

/// The bill so far by line; the lines add up to the bill exactly.
pub fn bill(s: &Scrape<'_>, e: &mut dyn MetricEncoder) -> fmt::Result {
    let Some(a) = s.snapshot.attribution.as_deref() else {
        return Ok(());
    };
    if a.price_per_gpu_hour.is_none() && a.bill.total == 0 {
        return Ok(());
    }
    let b = a.bill;
    let containers = a.containers.iter().fold(0u64, |t, c| t.saturating_add(c.cumulative_cost_nano));
    let lines = [
        ("containers", containers),
        ("evicted", b.evicted),
        ("idle", b.idle),
        ("driver_reserved", b.driver_reserved),
        ("unattributed", b.unattributed),
    ];
    counter_family(
        e,
        "bill",
        "The bill so far by line, in the price's currency; the lines add up to the GPUs' price.",
        None,
        lines.map(|(line, v)| ([("line", line)], currency(v))),
    )
}
