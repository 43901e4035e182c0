//! `gpu-tracer cost`: the bill split per namespace, pod label, pod, container or node, over a
//! period, with the lines that belong to no container (idle, driver-reserved, unattributed,
//! evicted) shown as lines or spread over the containers (the policy).
//!
//! Every source turns what it reads into [`Charge`]s in nano-currency (integers, exact):
//!
//! - [`from_snapshot`]: a running agent's snapshot (its gRPC API), the bill since it started;
//! - [`series`]: the agent's cost series as Prometheus stores them, from one agent's `/metrics`
//!   ([`series::from_exposition`]) or from a Prometheus server over a period for a whole fleet
//!   ([`prometheus`]);
//! - [`events`]: the `Bill` events of a recorded `gpu-tracer events` stream, the bill over the
//!   recording.
//!
//! [`Report::build`] groups the charges, applies the policy in integers and rounds to cents by
//! largest remainder, so that the rows add up to the total to the cent and the total is the sum of
//! the charges (the bill) rounded once. [`render`] writes it as a table, CSV or JSON.
pub mod bill;

use std::{collections::BTreeMap, fmt, str::FromStr};

use serde::Serialize;

use crate::model::AgentSnapshot;

/// Nano-currency per cent.
const NANO_PER_CENT: i128 = 10_000_000;

/// What a charge is for: a container's share, or one of the lines that belong to no container.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Line {
    Container,
    /// GPU time nobody used (the remainder of the SM share).
    Idle,
    /// Memory the driver holds for itself.
    DriverReserved,
    /// Memory or time seen on the GPU but not matched to a container.
    Unattributed,
    /// The cost of containers the agent no longer lists (its table is bounded).
    Evicted,
}

impl Line {
    /// The non-container lines, in the order reports list them.
    pub const OTHERS: [Line; 4] = [Line::Idle, Line::DriverReserved, Line::Unattributed, Line::Evicted];

    /// The value of the `line` label of `gpu_tracer_bill_total`.
    pub(crate) fn bill_label(self) -> &'static str {
        match self {
            Line::Container => "containers",
            Line::Idle => "idle",
            Line::DriverReserved => "driver_reserved",
            Line::Unattributed => "unattributed",
            Line::Evicted => "evicted",
        }
    }

    /// How a row of this line is named in a report.
    pub fn row_name(self) -> &'static str {
        match self {
            Line::Container => "(containers)",
            Line::Idle => "(idle)",
            Line::DriverReserved => "(driver reserved)",
            Line::Unattributed => "(unattributed)",
            Line::Evicted => "(evicted containers)",
        }
    }

    pub fn from_bill_label(s: &str) -> Option<Line> {
        [Line::Container].into_iter().chain(Line::OTHERS).find(|l| l.bill_label() == s)
    }
}

/// An amount of the bill and who it belongs to. `nano` may be negative only where a source
/// subtracts a baseline the agent later moved to another line (a container evicted within the
/// period: its earlier cost left its namespace for the `evicted` line).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Charge {
    pub node: String,
    pub line: Line,
    /// Empty for the other lines and for containers that are not in a pod.
    pub namespace: String,
    pub pod: String,
    pub container: String,
    /// The pod's allow-listed labels (`kubernetes.label_allow_list`).
    pub labels: BTreeMap<String, String>,
    pub nano: i128,
}

impl Charge {
    /// A charge of one of the other lines of a node.
    pub fn line(node: &str, line: Line, nano: i128) -> Charge {
        Charge {
            node: node.to_owned(),
            line,
            namespace: String::new(),
            pod: String::new(),
            container: String::new(),
            labels: BTreeMap::new(),
            nano,
        }
    }
}

/// A dimension of the report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupBy {
    Namespace,
    /// `namespace/pod`.
    Pod,
    /// `namespace/pod/container`.
    Container,
    Node,
    /// A pod label (allow-listed in the agent's `kubernetes.label_allow_list`).
    Label(String),
}

impl GroupBy {
    /// The column's heading.
    pub fn heading(&self) -> &str {
        match self {
            GroupBy::Namespace => "namespace",
            GroupBy::Pod => "pod",
            GroupBy::Container => "container",
            GroupBy::Node => "node",
            GroupBy::Label(k) => k,
        }
    }

    fn key(&self, c: &Charge) -> String {
        if c.line != Line::Container {
            return match self {
                GroupBy::Node => c.node.clone(),
                _ => c.line.row_name().to_owned(),
            };
        }
        let or = |s: &str, none: &str| if s.is_empty() { none.to_owned() } else { s.to_owned() };
        match self {
            GroupBy::Namespace => or(&c.namespace, "(no namespace)"),
            GroupBy::Pod if c.namespace.is_empty() => or(&c.pod, "(unknown)"),
            GroupBy::Pod => format!("{}/{}", c.namespace, c.pod),
            GroupBy::Container if c.namespace.is_empty() => or(&c.pod, "(unknown)"),
            GroupBy::Container => format!("{}/{}/{}", c.namespace, c.pod, c.container),
            GroupBy::Node => c.node.clone(),
            GroupBy::Label(k) => c.labels.get(k).cloned().unwrap_or_else(|| format!("(no {k} label)")),
        }
    }
}

/// Why a `--by` value was refused.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a grouping: use namespace, pod, container, node or label:KEY (a pod label)")]
pub struct GroupByError(String);

impl FromStr for GroupBy {
    type Err = GroupByError;

    fn from_str(s: &str) -> Result<GroupBy, GroupByError> {
        Ok(match s {
            "namespace" | "ns" => GroupBy::Namespace,
            "pod" => GroupBy::Pod,
            "container" => GroupBy::Container,
            "node" => GroupBy::Node,
            _ => match s.strip_prefix("label:") {
                Some(k) if !k.is_empty() => GroupBy::Label(k.to_owned()),
                _ => return Err(GroupByError(s.to_owned())),
            },
        })
    }
}

/// What happens to the lines that belong to no container.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// Each line is a row of its own: the containers pay for what they used.
    #[default]
    Lines,
    /// Each node's lines are spread over that node's containers in proportion to their cost
    /// (full cost recovery); a node without container cost keeps its lines.
    Spread,
}

/// What a source read: the charges, and what the report must say about them.
#[derive(Clone, Debug, Default)]
pub struct CostInput {
    /// Where the numbers come from (for people).
    pub source: String,
    /// The period, for people (e.g. "since the agent started", "the 30 d before …").
    pub period: String,
    /// The period's bounds, seconds since the epoch, when known.
    pub start_unix_s: Option<f64>,
    pub end_unix_s: Option<f64>,
    /// The prices per GPU-hour the agents applied (more than one: the nodes differ).
    pub prices_per_gpu_hour: Vec<f64>,
    pub charges: Vec<Charge>,
    /// Things the reader must know (inexact inputs, restarts, missing labels).
    pub warnings: Vec<String>,
}

/// One row: a group (or a line) and its amount.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Row {
    /// One value per `--by` dimension.
    pub key: Vec<String>,
    /// `container` for groups of containers, else the line the row is.
    pub line: Line,
    pub nano: i128,
    /// Rounded so that the rows add up to the total's cents.
    pub cents: i128,
}

impl Row {
    /// The `line` column: `container` or the bill line's name.
    pub fn line_name(&self) -> &'static str {
        match self.line {
            Line::Container => "container",
            l => l.bill_label(),
        }
    }
}

/// The bill split by group.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub source: String,
    pub period: String,
    pub start_unix_s: Option<f64>,
    pub end_unix_s: Option<f64>,
    pub prices_per_gpu_hour: Vec<f64>,
    pub policy: Policy,
    pub by: Vec<GroupBy>,
    pub rows: Vec<Row>,
    /// The sum of the charges, exact.
    pub total_nano: i128,
    /// `total_nano` rounded to the cent (half away from zero); the rows' cents add up to it.
    pub total_cents: i128,
    pub warnings: Vec<String>,
}

impl Report {
    /// Group `input`'s charges by `by` (in order; none: one row per namespace) under `policy`.
    pub fn build(input: CostInput, by: &[GroupBy], policy: Policy) -> Report {
        let by = if by.is_empty() { vec![GroupBy::Namespace] } else { by.to_vec() };
        let charges = match policy {
            Policy::Lines => input.charges,
            Policy::Spread => spread(input.charges),
        };
        let total_nano: i128 = charges.iter().map(|c| c.nano).sum();
        let mut groups: BTreeMap<(bool, Line, Vec<String>), i128> = BTreeMap::new();
        for c in &charges {
            let key: Vec<String> = by.iter().map(|b| b.key(c)).collect();
            // Container groups first, then the lines in their order.
            *groups.entry((c.line != Line::Container, c.line, key)).or_default() += c.nano;
        }
        let mut rows: Vec<Row> =
            groups.into_iter().map(|((_, line, key), nano)| Row { key, line, nano, cents: 0 }).collect();
        let total_cents = round_cents(total_nano);
        let cents = split_cents(&rows.iter().map(|r| r.nano).collect::<Vec<_>>(), total_cents);
        for (r, c) in rows.iter_mut().zip(cents) {
            r.cents = c;
        }
        // Largest container groups first; the lines keep their order at the end.
        rows.sort_by(|a, b| {
            (a.line != Line::Container, a.line)
                .cmp(&(b.line != Line::Container, b.line))
                .then_with(|| if a.line == Line::Container { b.nano.cmp(&a.nano) } else { std::cmp::Ordering::Equal })
                .then_with(|| a.key.cmp(&b.key))
        });
        Report {
            source: input.source,
            period: input.period,
            start_unix_s: input.start_unix_s,
            end_unix_s: input.end_unix_s,
            prices_per_gpu_hour: input.prices_per_gpu_hour,
            policy,
            by,
            rows,
            total_nano,
            total_cents,
            warnings: input.warnings,
        }
    }
}

/// Nano-currency rounded to the cent, half away from zero.
pub fn round_cents(nano: i128) -> i128 {
    let half = NANO_PER_CENT / 2;
    if nano >= 0 { (nano + half) / NANO_PER_CENT } else { -((-nano + half) / NANO_PER_CENT) }
}

/// Cents per amount that add up to `total_cents` exactly: each amount's floor, then one more cent
/// to the amounts with the largest remainders (ties: the earlier amount) until the sum is
/// reached (largest-remainder rounding; `total_cents` must be the rounded sum of `nano`).
pub(crate) fn split_cents(nano: &[i128], total_cents: i128) -> Vec<i128> {
    let mut cents: Vec<i128> = nano.iter().map(|n| n.div_euclid(NANO_PER_CENT)).collect();
    let mut left = total_cents - cents.iter().sum::<i128>();
    let mut order: Vec<usize> = (0..nano.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(nano[i].rem_euclid(NANO_PER_CENT)), i));
    // `left` is within 0..=len for a rounded total; the loop also copes with anything else.
    let mut i = 0;
    while left != 0 && !order.is_empty() {
        let at = order[i % order.len()];
        cents[at] += left.signum();
        left -= left.signum();
        i += 1;
    }
    cents
}

/// `total` split in proportion to `weights` (non-negative), exactly: floors, then the remainder
/// by largest remainder. All weights zero: nothing to split against (`None`).
pub(crate) fn split_proportional(total: i128, weights: &[i128]) -> Option<Vec<i128>> {
    let w: i128 = weights.iter().map(|w| (*w).max(0)).sum();
    if w == 0 {
        return None;
    }
    let sign = total.signum();
    let t = total.abs();
    let mut parts = Vec::with_capacity(weights.len());
    let mut rems = Vec::with_capacity(weights.len());
    for x in weights.iter().map(|x| (*x).max(0)) {
        // t * x fits: amounts are below 2^63 nano (9 billion in the currency) each.
        let p = t.checked_mul(x).map(|m| (m / w, m % w)).unwrap_or_else(|| {
            let f = t as f64 * (x as f64 / w as f64);
            (f.floor() as i128, 0)
        });
        parts.push(p.0);
        rems.push(p.1);
    }
    let mut left = t - parts.iter().sum::<i128>();
    let mut order: Vec<usize> = (0..weights.len()).filter(|&i| weights[i] > 0).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(rems[i]), i));
    let mut i = 0;
    while left > 0 && !order.is_empty() {
        parts[order[i % order.len()]] += 1;
        left -= 1;
        i += 1;
    }
    Some(parts.into_iter().map(|p| p * sign).collect())
}

/// The spread policy: each node's other lines go to its containers in proportion to their cost.
fn spread(charges: Vec<Charge>) -> Vec<Charge> {
    let mut by_node: BTreeMap<String, (Vec<Charge>, Vec<Charge>)> = BTreeMap::new();
    for c in charges {
        let e = by_node.entry(c.node.clone()).or_default();
        if c.line == Line::Container { e.0.push(c) } else { e.1.push(c) }
    }
    let mut out = Vec::new();
    for (_, (mut containers, others)) in by_node {
        let pool: i128 = others.iter().map(|c| c.nano).sum();
        let weights: Vec<i128> = containers.iter().map(|c| c.nano).collect();
        match split_proportional(pool, &weights) {
            Some(parts) => {
                for (c, p) in containers.iter_mut().zip(parts) {
                    c.nano += p;
                }
                out.extend(containers);
            }
            None => {
                out.extend(containers);
                out.extend(others);
            }
        }
    }
    out
}

/// Why a snapshot has no bill to report.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotCostError {
    #[error("the agent computes no attribution (NVML is not in use: {0}); the bill needs NVML's view of the GPUs")]
    NoAttribution(String),
    #[error(
        "the agent computes no cost: set attribution.price_per_gpu_hour in its configuration (the price of one \
         GPU for one hour)"
    )]
    NoPrice,
}

/// The bill a running agent keeps (since it started), as charges. `node` names the agent's node.
pub fn from_snapshot(s: &AgentSnapshot, node: &str) -> Result<CostInput, SnapshotCostError> {
    let a = s.attribution.as_deref().ok_or_else(|| {
        SnapshotCostError::NoAttribution(s.nvml.reason.clone().unwrap_or_else(|| "no interval completed yet".into()))
    })?;
    let price = a.price_per_gpu_hour.ok_or(SnapshotCostError::NoPrice)?;
    let mut charges = Vec::new();
    for c in &a.containers {
        if c.cumulative_cost_nano == 0 {
            continue;
        }
        let id = s.containers.get(&c.container.0);
        let field =
            |f: fn(&crate::identity::ContainerIdentity) -> Option<&String>| id.and_then(f).cloned().unwrap_or_default();
        let mut charge = Charge {
            node: node.to_owned(),
            line: Line::Container,
            namespace: field(|i| i.namespace.as_ref()),
            pod: field(|i| i.pod.as_ref()),
            container: field(|i| i.container.as_ref()),
            labels: id.map(|i| i.labels.clone()).unwrap_or_default(),
            nano: c.cumulative_cost_nano as i128,
        };
        if charge.pod.is_empty() {
            // Not a pod's container: named by its cgroup, as /metrics does.
            charge.namespace.clear();
            charge.pod = id
                .and_then(|i| i.cgroup_path.clone())
                .or_else(|| c.name.clone())
                .unwrap_or_else(|| format!("cgroup id {}", c.container.0));
        }
        charges.push(charge);
    }
    let b = a.bill;
    for (line, nano) in [
        (Line::Idle, b.idle),
        (Line::DriverReserved, b.driver_reserved),
        (Line::Unattributed, b.unattributed),
        (Line::Evicted, b.evicted),
    ] {
        charges.push(Charge::line(node, line, nano as i128));
    }
    let mut warnings = Vec::new();
    let sum: i128 = charges.iter().map(|c| c.nano).sum();
    if sum != b.total as i128 {
        warnings.push(format!(
            "the agent's lines add up to {sum} nano, its bill says {} (a bug: please report it)",
            b.total
        ));
    }
    let end = a.start_unix_ns.saturating_add(a.interval_ns) as f64 / 1e9;
    Ok(CostInput {
        source: format!("the agent on {node} (its API)"),
        period: "since the agent started".into(),
        start_unix_s: None,
        end_unix_s: Some(end),
        prices_per_gpu_hour: vec![price],
        charges,
        warnings,
    })
}

/// Formats cents as `-12.34`.
pub struct Cents(pub i128);

impl fmt::Display for Cents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.0 < 0 { "-" } else { "" };
        let a = self.0.abs();
        f.pad(&format!("{sign}{}.{:02}", a / 100, a % 100))
    }
}

#[cfg(test)]
mod tests;
