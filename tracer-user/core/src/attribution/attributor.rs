//! The stateful part: the bill so far (exact, per container and per line), idle reservations and
//! rightsizing history. Bounded: at most [`MAX_CONTAINERS`] containers and [`HISTORY_BUCKETS`]
//! history buckets each; what is evicted is counted, and an evicted container's cost moves to the
//! `evicted` line so the bill still adds up.
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use super::{
    gpu::{ComputeMethod, CostParams, GpuAttribution, attribute_gpu},
    input::{AttributionInput, ContainerKey, GpuRequest},
    rightsizing::{Fit, Rightsizing, fit, is_over_requested, p95},
};
use crate::config::AttributionSettings;

/// Most containers kept (live or with cost history).
pub(crate) const MAX_CONTAINERS: usize = 4096;
/// Most GPUs whose billing carry is kept.
pub const MAX_GPUS: usize = 1024;
/// Stale rightsizing results recomputed per update (at 8 GPUs × 100 containers, a rollover is
/// absorbed in 7 updates).
const STALE_RIGHTSIZING_PER_UPDATE: usize = 128;

/// History buckets per container over the rightsizing window (each keeps the bucket's maxima, so
/// p95 is of per-bucket peaks: conservative for rightsizing).
pub const HISTORY_BUCKETS: usize = 120;

const NS_PER_HOUR: u128 = 3_600_000_000_000;

/// The bill so far, nano-currency: Σ containers' `cost_nano` + `evicted` + `idle` +
/// `driver_reserved` + `unattributed` = `total` exactly.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bill {
    pub total: u64,
    pub idle: u64,
    pub driver_reserved: u64,
    pub unattributed: u64,
    /// Cost of containers evicted from the table (bounded memory).
    pub evicted: u64,
}

/// A container that holds GPU memory but has run nothing for at least `idle_reservation_after_s`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdleReservation {
    /// Start of the first idle interval, ns since the epoch.
    pub since_unix_ns: u64,
    pub held_bytes: u64,
}

/// One container across GPUs: this interval, the totals so far, and flags.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ContainerSummary {
    pub container: ContainerKey,
    pub name: Option<String>,
    /// UUIDs of the GPUs it was on this interval (empty: not seen this interval).
    pub gpus: Vec<String>,
    /// This interval: memory summed over GPUs.
    pub memory_bytes: u64,
    /// This interval: the largest SM share it had on one GPU (millipercent of that GPU).
    pub sm_millipct: u32,
    pub launches: u64,
    pub energy_mj: u64,
    pub cost_nano: u64,
    /// Since the agent started (or the container first appeared).
    pub cumulative_cost_nano: u64,
    pub cumulative_energy_mj: u64,
    pub last_seen_unix_ns: u64,
    pub idle_reservation: Option<IdleReservation>,
    pub rightsizing: Option<Rightsizing>,
}

/// What the attributor dropped to stay bounded, and inputs it could not use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttributorCounters {
    pub intervals: u64,
    pub evicted_containers: u64,
    pub evicted_gpus: u64,
    /// Inputs with more than `MAX_GPUS` GPUs: the rest were not attributed.
    pub dropped_gpus: u64,
    /// The configured price was not a finite, non-negative number: cost not computed.
    pub invalid_price: u64,
}

/// One interval's attribution, with the history-derived parts. Immutable; share it in an `Arc`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttributionSnapshot {
    pub start_unix_ns: u64,
    pub interval_ns: u64,
    /// The price of one GPU for one hour, as applied (`None`: cost not computed).
    pub price_per_gpu_hour: Option<f64>,
    pub gpus: Vec<GpuAttribution>,
    /// Every container kept, by key.
    pub containers: Vec<ContainerSummary>,
    pub bill: Bill,
    pub counters: AttributorCounters,
}

#[derive(Clone, Copy, Debug, Default)]
struct Bucket {
    index: u64,
    max_memory: u64,
    max_sm: u32,
}

#[derive(Clone, Debug, Default)]
struct ContainerState {
    name: Option<String>,
    request: Option<GpuRequest>,
    cost: u64,
    energy: u64,
    last_seen: u64,
    idle_since: Option<u64>,
    history: VecDeque<Bucket>,
    gpu_total: u64,
    /// Rightsizing over `history`, recomputed only when the history or the request changes.
    rightsizing: Option<Rightsizing>,
    /// The history changed (a new bucket, a new maximum) since `rightsizing` was computed:
    /// recomputed within the next updates, a bounded number per update (every container rolls to
    /// a new bucket at the same time). A new request is recomputed at once.
    stale: bool,
}

#[derive(Clone, Copy, Debug, Default)]
struct GpuBill {
    price_per_hour_nano: u128,
    ns: u128,
    last_seen: u64,
}

/// Owns the history; `update` once per interval.
#[derive(Clone, Debug)]
pub struct Attributor {
    settings: AttributionSettings,
    containers: BTreeMap<ContainerKey, ContainerState>,
    gpu_bills: BTreeMap<String, GpuBill>,
    bill: Bill,
    counters: AttributorCounters,
    max_containers: usize,
}

fn valid_price(p: Option<f64>) -> Option<Option<f64>> {
    match p {
        None => Some(None),
        Some(v) if v.is_finite() && v >= 0.0 => Some(Some(v)),
        Some(_) => None,
    }
}

impl Attributor {
    /// An attributor keeping at most [`MAX_CONTAINERS`] containers.
    pub fn new(settings: &AttributionSettings) -> Self {
        Self::with_max_containers(settings, MAX_CONTAINERS)
    }

    /// An attributor keeping at most `max_containers` containers (at least 1).
    pub(crate) fn with_max_containers(settings: &AttributionSettings, max_containers: usize) -> Self {
        Self {
            max_containers: max_containers.max(1),
            settings: settings.clone(),
            containers: BTreeMap::new(),
            gpu_bills: BTreeMap::new(),
            bill: Bill::default(),
            counters: AttributorCounters::default(),
        }
    }

    /// The bill so far.
    pub fn bill(&self) -> Bill {
        self.bill
    }

    #[cfg(test)]
    /// Sum of every kept container's cost so far (with `bill()`'s lines it makes the total).
    pub(crate) fn containers_cost(&self) -> u128 {
        self.containers.values().map(|c| c.cost as u128).sum()
    }

    /// Price of one GPU-hour for this input (`Err` when the setting is invalid).
    fn gpu_hour_price(&self, input: &AttributionInput) -> Result<Option<f64>, ()> {
        let gpu = valid_price(self.settings.price_per_gpu_hour).ok_or(())?;
        let node = valid_price(self.settings.price_per_node_hour).ok_or(())?;
        if gpu.is_some() {
            return Ok(gpu);
        }
        let physical: BTreeSet<&str> = input.gpus.iter().map(|g| g.parent_uuid.as_deref().unwrap_or(&g.uuid)).collect();
        Ok(node.map(|n| if physical.is_empty() { 0.0 } else { n / physical.len() as f64 }))
    }

    /// Attribute one interval and fold it into the history.
    pub fn update(&mut self, input: &AttributionInput) -> AttributionSnapshot {
        self.counters.intervals += 1;
        let now = input.start_unix_ns.saturating_add(input.interval_ns);
        let price = match self.gpu_hour_price(input) {
            Ok(p) => p,
            Err(()) => {
                self.counters.invalid_price += 1;
                None
            }
        };
        let gpus_in = if input.gpus.len() > MAX_GPUS {
            self.counters.dropped_gpus += (input.gpus.len() - MAX_GPUS) as u64;
            &input.gpus[..MAX_GPUS]
        } else {
            &input.gpus[..]
        };
        let names = |k: ContainerKey| input.containers.get(&k).and_then(|c| c.name.clone());
        let blend_ppm = {
            let w = self.settings.blend_memory_weight;
            if w.is_finite() { (w.clamp(0.0, 1.0) * 1e6).round() as u32 } else { 500_000 }
        };
        let mut gpus = Vec::with_capacity(gpus_in.len());
        for g in gpus_in {
            let cost = price.map(|p| {
                let per_hour = (p * 1e9).round().min(u64::MAX as f64) as u128
                    * g.share_of_gpu_ppm.min(1_000_000) as u128
                    / 1_000_000;
                let price_nano = self.interval_price(&g.uuid, per_hour, input.interval_ns as u128, now);
                CostParams {
                    price_nano,
                    policy: self.settings.cost_policy,
                    blend_memory_ppm: blend_ppm,
                    unused: self.settings.unused_cost,
                }
            });
            gpus.push(attribute_gpu(g, &names, cost));
        }
        self.evict_gpus();
        self.fold(input, &gpus, now);
        let containers = self.summaries(input, &gpus);
        AttributionSnapshot {
            start_unix_ns: input.start_unix_ns,
            interval_ns: input.interval_ns,
            price_per_gpu_hour: price,
            gpus,
            containers,
            bill: self.bill,
            counters: self.counters,
        }
    }

    /// This interval's price for one GPU: the bill so far at this price rounded down, minus what
    /// was billed before, so rounding never accumulates.
    fn interval_price(&mut self, uuid: &str, per_hour: u128, dt: u128, now: u64) -> u64 {
        let b = self.gpu_bills.entry(uuid.to_string()).or_default();
        if b.price_per_hour_nano != per_hour {
            *b = GpuBill { price_per_hour_nano: per_hour, ns: 0, last_seen: now };
        }
        let before = b.price_per_hour_nano.saturating_mul(b.ns) / NS_PER_HOUR;
        b.ns = b.ns.saturating_add(dt);
        b.last_seen = now;
        let after = b.price_per_hour_nano.saturating_mul(b.ns) / NS_PER_HOUR;
        (after - before).min(u64::MAX as u128) as u64
    }

    fn evict_gpus(&mut self) {
        while self.gpu_bills.len() > MAX_GPUS {
            let oldest = self.gpu_bills.iter().min_by_key(|(k, b)| (b.last_seen, (*k).clone())).map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                self.gpu_bills.remove(&k);
                self.counters.evicted_gpus += 1;
            }
        }
    }

    /// Add the interval's costs to the bill and each container's history.
    fn fold(&mut self, input: &AttributionInput, gpus: &[GpuAttribution], now: u64) {
        let s = &self.settings;
        let bucket_ns = (s.rightsizing_window_s.saturating_mul(1_000_000_000) / HISTORY_BUCKETS as u64).max(1);
        let bucket = now / bucket_ns;
        let window_buckets = HISTORY_BUCKETS as u64;
        // Per container this interval: memory (sum, max per GPU, that GPU's total), SM max,
        // launches, cost, energy, whether its activity could be observed.
        #[derive(Default)]
        struct Acc {
            mem: u64,
            max_mem: u64,
            gpu_total: u64,
            sm: u32,
            launches: u64,
            cost: u64,
            energy: u64,
            observable: bool,
        }
        let mut acc: BTreeMap<ContainerKey, Acc> = BTreeMap::new();
        for g in gpus {
            if let Some(c) = &g.cost {
                self.bill.total = self.bill.total.saturating_add(c.price_nano);
                self.bill.idle = self.bill.idle.saturating_add(c.idle);
                self.bill.driver_reserved = self.bill.driver_reserved.saturating_add(c.driver_reserved);
                self.bill.unattributed = self.bill.unattributed.saturating_add(c.unattributed);
            }
            let total = g.memory.map_or(0, |m| m.total);
            for l in &g.containers {
                let a = acc.entry(l.container).or_default();
                a.mem = a.mem.saturating_add(l.memory_bytes);
                if l.memory_bytes >= a.max_mem {
                    a.max_mem = l.memory_bytes;
                    a.gpu_total = total;
                }
                a.sm = a.sm.max(l.sm_millipct);
                a.launches = a.launches.saturating_add(l.launches);
                a.cost = a.cost.saturating_add(l.cost_nano.unwrap_or(0));
                a.energy = a.energy.saturating_add(l.energy_mj.unwrap_or(0));
                a.observable |= g.compute.method != ComputeMethod::None || l.launches > 0;
            }
        }
        for (k, a) in acc {
            let c = self.containers.entry(k).or_default();
            if let Some(info) = input.containers.get(&k)
                && info.name.is_some()
                && info.name != c.name
            {
                c.name = info.name.clone();
            }
            let mut changed = false;
            if let Some(info) = input.containers.get(&k)
                && info.request.is_some()
                && info.request != c.request
            {
                c.request = info.request.clone();
                changed = true;
            }
            c.cost = c.cost.saturating_add(a.cost);
            c.energy = c.energy.saturating_add(a.energy);
            c.last_seen = now;
            let gpu_total = if a.max_mem > 0 || c.gpu_total == 0 { a.gpu_total } else { c.gpu_total };
            c.stale |= gpu_total != c.gpu_total;
            c.gpu_total = gpu_total;
            let idle = a.mem > 0 && a.launches == 0 && a.sm == 0 && a.observable;
            c.idle_since = if idle { c.idle_since.or(Some(input.start_unix_ns)) } else { None };
            match c.history.back_mut() {
                Some(b) if b.index == bucket => {
                    c.stale |= a.max_mem > b.max_memory || a.sm > b.max_sm;
                    b.max_memory = b.max_memory.max(a.max_mem);
                    b.max_sm = b.max_sm.max(a.sm);
                }
                _ => {
                    c.history.push_back(Bucket { index: bucket, max_memory: a.max_mem, max_sm: a.sm });
                    c.stale = true;
                }
            }
            while c.history.front().is_some_and(|b| b.index + window_buckets <= bucket)
                || c.history.len() > HISTORY_BUCKETS
            {
                c.history.pop_front();
                c.stale = true;
            }
            if changed || c.rightsizing.is_none() {
                c.rightsizing = rightsizing_of(c, bucket_ns, s.rightsizing_headroom_pct);
                c.stale = false;
            }
        }
        // A bucket rollover makes every container stale at once: spread their recomputation over
        // the next updates so that no single update pays for all of them.
        let mut budget = STALE_RIGHTSIZING_PER_UPDATE;
        for c in self.containers.values_mut().filter(|c| c.stale) {
            if budget == 0 {
                break;
            }
            budget -= 1;
            c.rightsizing = rightsizing_of(c, bucket_ns, s.rightsizing_headroom_pct);
            c.stale = false;
        }
        // Bounded: the containers seen longest ago go first; their cost stays in the bill.
        while self.containers.len() > self.max_containers {
            let oldest = self.containers.iter().min_by_key(|(k, c)| (c.last_seen, **k)).map(|(k, _)| *k);
            if let Some(k) = oldest
                && let Some(c) = self.containers.remove(&k)
            {
                self.bill.evicted = self.bill.evicted.saturating_add(c.cost);
                self.counters.evicted_containers += 1;
            }
        }
    }

    fn summaries(&self, input: &AttributionInput, gpus: &[GpuAttribution]) -> Vec<ContainerSummary> {
        let s = &self.settings;
        let now = input.start_unix_ns.saturating_add(input.interval_ns);
        // In key order (the map's), so a GPU line finds its summary by binary search.
        let mut out: Vec<ContainerSummary> = self
            .containers
            .iter()
            .map(|(k, c)| {
                let idle_reservation = c.idle_since.filter(|since| {
                    now.saturating_sub(*since) >= s.idle_reservation_after_s.saturating_mul(1_000_000_000)
                });
                let rightsizing = c.rightsizing.clone();
                ContainerSummary {
                    container: *k,
                    name: c.name.clone(),
                    gpus: Vec::new(),
                    memory_bytes: 0,
                    sm_millipct: 0,
                    launches: 0,
                    energy_mj: 0,
                    cost_nano: 0,
                    cumulative_cost_nano: c.cost,
                    cumulative_energy_mj: c.energy,
                    last_seen_unix_ns: c.last_seen,
                    idle_reservation: idle_reservation
                        .map(|since| IdleReservation { since_unix_ns: since, held_bytes: 0 }),
                    rightsizing,
                }
            })
            .collect();
        for g in gpus {
            for l in &g.containers {
                if let Ok(i) = out.binary_search_by_key(&l.container, |s| s.container) {
                    let s = &mut out[i];
                    s.gpus.push(g.uuid.clone());
                    s.memory_bytes = s.memory_bytes.saturating_add(l.memory_bytes);
                    s.sm_millipct = s.sm_millipct.max(l.sm_millipct);
                    s.launches = s.launches.saturating_add(l.launches);
                    s.energy_mj = s.energy_mj.saturating_add(l.energy_mj.unwrap_or(0));
                    s.cost_nano = s.cost_nano.saturating_add(l.cost_nano.unwrap_or(0));
                }
            }
        }
        for s in out.iter_mut() {
            if let Some(r) = &mut s.idle_reservation {
                r.held_bytes = s.memory_bytes;
            }
        }
        out
    }
}

/// Peak and p95 over the history buckets, and what would fit.
fn rightsizing_of(c: &ContainerState, bucket_ns: u64, headroom_pct: u32) -> Option<Rightsizing> {
    if c.history.is_empty() {
        return None;
    }
    // On the stack: the history is at most HISTORY_BUCKETS long.
    let mut mem = [0u64; HISTORY_BUCKETS];
    let mut sm = [0u64; HISTORY_BUCKETS];
    let n = c.history.len().min(HISTORY_BUCKETS);
    for (i, b) in c.history.iter().take(n).enumerate() {
        mem[i] = b.max_memory;
        sm[i] = b.max_sm as u64;
    }
    let (mem, sm) = (&mut mem[..n], &mut sm[..n]);
    let peak_memory = mem.iter().copied().max().unwrap_or(0);
    let peak_sm = sm.iter().copied().max().unwrap_or(0) as u32;
    let f = fit(c.gpu_total, peak_memory, peak_sm, headroom_pct);
    let first = c.history.front().map_or(0, |b| b.index);
    let last = c.history.back().map_or(0, |b| b.index);
    Some(Rightsizing {
        covered_s: (last - first + 1).saturating_mul(bucket_ns) / 1_000_000_000,
        samples: n,
        peak_memory_bytes: peak_memory,
        p95_memory_bytes: p95(mem),
        peak_sm_millipct: peak_sm,
        p95_sm_millipct: p95(sm) as u32,
        gpu_total_bytes: c.gpu_total,
        over_requested: c.request.as_ref().is_some_and(|r| is_over_requested(r, &f)),
        request: c.request.clone(),
        fit: f,
    })
}

/// Is this fit worth a footnote? (Smaller than the request, or no request and smaller than a GPU.)
pub fn suggests_smaller(r: &Rightsizing) -> bool {
    match &r.request {
        Some(_) => r.over_requested,
        None => r.fit != Fit::WholeGpu,
    }
}
