//! The attribution families: per GPU, the latest interval split into lines that add up to the
//! device (`attribution_*`, `gpu_sharing_info`); per container, cumulative energy and cost, idle
//! reservations and rightsizing (`container_*`); and the bill by line.
use std::{collections::BTreeMap, fmt};

use prometheus_client::{
    encoding::{DescriptorEncoder, EncodeLabelSet},
    registry::Unit,
};

use super::{
    ContainerLabels, GpuIdLabels, Scrape, counter_family, currency, gauge, gauge_family, joules, ratio_of_millipct,
    ratio_unit,
};
use crate::attribution::{SharingMode, attributor::suggests_smaller, gpu::ComputeMethod, rightsizing::Fit};

/// One line of a GPU's split: `line` is `container` (with the container labels) or a named
/// remainder (`driver_reserved`, `unattributed`, `free`, `idle`) with empty container labels, so
/// `sum by (gpu)` over a family is the device total.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, EncodeLabelSet)]
struct GpuLineLabels {
    #[prometheus(flatten)]
    gpu: GpuIdLabels,
    line: &'static str,
    #[prometheus(flatten)]
    container: ContainerLabels,
}

impl EncodeLabelSet for &GpuLineLabels {
    fn encode(&self, encoder: &mut prometheus_client::encoding::LabelSetEncoder) -> fmt::Result {
        (**self).encode(encoder)
    }
}

/// Per GPU, a sharing mode and compute method (info-style, value 1).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, EncodeLabelSet)]
struct SharingLabels {
    #[prometheus(flatten)]
    gpu: GpuIdLabels,
    mode: &'static str,
    method: &'static str,
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
pub fn attribution_lines(s: &Scrape<'_>, e: &mut DescriptorEncoder<'_>) -> fmt::Result {
    let Some(a) = s.snapshot.attribution.as_deref() else {
        return Ok(());
    };
    type Lines = BTreeMap<GpuLineLabels, u64>;
    let (mut memory, mut sm, mut energy, mut cost, mut launches) =
        (Lines::new(), Lines::new(), Lines::new(), Lines::new(), Lines::new());
    let mut totals: BTreeMap<GpuIdLabels, u64> = BTreeMap::new();
    let mut sharing: BTreeMap<SharingLabels, u64> = BTreeMap::new();
    let add = |m: &mut Lines, gpu: &GpuIdLabels, line: &'static str, c: Option<&ContainerLabels>, v: u64| {
        let k = GpuLineLabels { gpu: gpu.clone(), line, container: c.cloned().unwrap_or_default() };
        let slot = m.entry(k).or_default();
        *slot = slot.saturating_add(v);
    };
    for g in &a.gpus {
        let id = GpuIdLabels::new(&g.uuid, g.minor, g.mig_profile.as_deref());
        sharing.insert(
            SharingLabels {
                gpu: id.clone(),
                mode: sharing_mode_label(g.sharing),
                method: compute_method_label(g.compute.method),
            },
            1,
        );
        for c in &g.containers {
            let labels = s.container_by_id(c.container.0);
            let l = Some(&labels);
            add(&mut sm, &id, "container", l, c.sm_millipct as u64);
            add(&mut launches, &id, "container", l, c.launches);
            if g.memory.is_some() {
                add(&mut memory, &id, "container", l, c.memory_bytes);
            }
            if let Some(mj) = c.energy_mj {
                add(&mut energy, &id, "container", l, mj);
            }
            if let Some(n) = c.cost_nano {
                add(&mut cost, &id, "container", l, n);
            }
        }
        if let Some(m) = &g.memory {
            add(&mut memory, &id, "driver_reserved", None, m.driver_reserved);
            add(&mut memory, &id, "unattributed", None, m.unattributed);
            add(&mut memory, &id, "free", None, m.free);
            let t = totals.entry(id.clone()).or_default();
            *t = t.saturating_add(m.total);
        }
        add(&mut sm, &id, "unattributed", None, g.compute.unattributed as u64);
        add(&mut sm, &id, "idle", None, g.compute.idle as u64);
        if let Some(en) = &g.energy {
            add(&mut energy, &id, "unattributed", None, en.unattributed);
            add(&mut energy, &id, "idle", None, en.idle);
        }
        if let Some(k) = &g.cost {
            add(&mut cost, &id, "driver_reserved", None, k.driver_reserved);
            add(&mut cost, &id, "unattributed", None, k.unattributed);
            add(&mut cost, &id, "idle", None, k.idle);
        }
    }
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
        Some(&Unit::Bytes),
        memory.iter().map(|(l, v)| (l, *v)),
    )?;
    gauge_family(
        e,
        "attribution_memory_total",
        "GPU memory total the attribution lines add up to.",
        Some(&Unit::Bytes),
        totals.iter().map(|(l, v)| (l, *v)),
    )?;
    gauge_family(
        e,
        "attribution_sm_share",
        "Share of the interval's SM time by line (container, unattributed, idle); sums to 1 per GPU.",
        Some(&ratio_unit()),
        sm.iter().map(|(l, v)| (l, ratio_of_millipct(*v))),
    )?;
    gauge_family(
        e,
        "attribution_interval_energy",
        "GPU energy of the latest interval by line (container, unattributed, idle).",
        Some(&Unit::Joules),
        energy.iter().map(|(l, v)| (l, joules(*v))),
    )?;
    gauge_family(
        e,
        "attribution_interval_cost",
        "The GPU's price for the latest interval by line, in the price's currency.",
        None,
        cost.iter().map(|(l, v)| (l, currency(*v))),
    )?;
    gauge_family(
        e,
        "attribution_interval_launches",
        "Kernel launches per container and GPU in the latest interval.",
        None,
        launches.iter().map(|(l, v)| (l, *v)),
    )?;
    gauge(
        e,
        "attribution_interval",
        "Length of the latest attribution interval.",
        Some(&Unit::Seconds),
        a.interval_ns as f64 / 1e9,
    )?;
    if let Some(p) = a.price_per_gpu_hour {
        gauge(e, "price_per_gpu_hour", "The price of one GPU for one hour, as applied to cost.", None, p)?;
    }
    Ok(())
}

/// Labels of a container's rightsizing suggestion.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, EncodeLabelSet)]
struct RightsizingLabels {
    #[prometheus(flatten)]
    container: ContainerLabels,
    /// `mig_profile`, `fraction` or `whole_gpu`.
    fit: &'static str,
    /// The MIG profile, `NN%` of the GPU, or `whole`.
    suggested: String,
    /// The fit is smaller than what it asked for (or than a GPU, with no request).
    smaller: &'static str,
}

/// Per container across GPUs: cumulative energy and cost, idle reservations and rightsizing.
pub fn container_totals(s: &Scrape<'_>, e: &mut DescriptorEncoder<'_>) -> fmt::Result {
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
    let mut acc: BTreeMap<ContainerLabels, Acc> = BTreeMap::new();
    let mut rightsizing: BTreeMap<RightsizingLabels, u64> = BTreeMap::new();
    // (container, stat) -> (memory bytes, SM millipercent).
    let mut peaks: BTreeMap<(ContainerLabels, &'static str), (u64, u64)> = BTreeMap::new();
    for c in &a.containers {
        let labels = s.container_by_id(c.container.0);
        let x = acc.entry(labels.clone()).or_default();
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
            rightsizing.insert(RightsizingLabels { container: labels.clone(), fit, suggested, smaller }, 1);
            for (stat, mem, sm) in
                [("peak", r.peak_memory_bytes, r.peak_sm_millipct), ("p95", r.p95_memory_bytes, r.p95_sm_millipct)]
            {
                let p = peaks.entry((labels.clone(), stat)).or_default();
                p.0 = p.0.max(mem);
                p.1 = p.1.max(sm as u64);
            }
        }
    }
    counter_family(
        e,
        "container_energy",
        "GPU energy attributed to the container since it first appeared (its share of each GPU's energy).",
        Some(&Unit::Joules),
        acc.iter().map(|(l, x)| (l, joules(x.energy_mj))),
    )?;
    counter_family(
        e,
        "container_cost",
        "Cost attributed to the container since it first appeared, in the price's currency.",
        None,
        acc.iter().filter(|(_, x)| x.has_cost).map(|(l, x)| (l, currency(x.cost_nano))),
    )?;
    gauge_family(
        e,
        "container_idle_reservation",
        "GPU memory held by a container that has run nothing for the configured time (only flagged containers).",
        Some(&Unit::Bytes),
        acc.iter().filter_map(|(l, x)| Some((l, x.idle_bytes?))),
    )?;
    gauge_family(
        e,
        "container_idle_reservation_since_timestamp",
        "When a flagged container's idle reservation started (Unix time).",
        Some(&Unit::Seconds),
        acc.iter().filter(|(_, x)| x.idle_bytes.is_some()).map(|(l, x)| (l, x.idle_since_ns as f64 / 1e9)),
    )?;
    gauge_family(
        e,
        "container_rightsizing_info",
        "What would fit the container's peak use with headroom (fit, suggested), and whether it is smaller; value 1.",
        None,
        rightsizing,
    )?;
    gauge_family(
        e,
        "container_rightsizing_memory",
        "Peak and p95 of the container's GPU memory over the rightsizing window, by stat.",
        Some(&Unit::Bytes),
        peaks.iter().map(|(l, (m, _))| ((&l.0, [("stat", l.1)]), *m)),
    )?;
    gauge_family(
        e,
        "container_rightsizing_sm_share",
        "Peak and p95 of the container's SM share (of one GPU) over the rightsizing window, by stat.",
        Some(&ratio_unit()),
        peaks.iter().map(|(l, (_, sm))| ((&l.0, [("stat", l.1)]), ratio_of_millipct(*sm))),
    )
}

/// The bill so far by line; the lines add up to the bill exactly.
pub fn bill(s: &Scrape<'_>, e: &mut DescriptorEncoder<'_>) -> fmt::Result {
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
