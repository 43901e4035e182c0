//! The agent's cost series, as `/metrics` serves them and Prometheus stores them, turned into
//! charges: `gpu_tracer_container_cost_total{namespace,pod,container[,cgroup]}` per container,
//! `gpu_tracer_bill_total{line}` for the lines that belong to no container (its `containers` line
//! is the sum of the containers, used as a check), `gpu_tracer_pod_labels` for the pods' labels
//! and `gpu_tracer_price_per_gpu_hour`.
//!
//! Values are in the price's currency as floats; the agent writes `nano / 1e9`, so rounding
//! `value × 1e9` gives its integer back exactly for amounts below 4.5 million of the currency per
//! series (2^52 nano), and sums are then exact.
use std::collections::{BTreeMap, BTreeSet};

use openmetrics_parser::PrometheusValue;

use tracer_core::cost::{Charge, CostInput, Line};

pub(crate) const CONTAINER_COST: &str = "gpu_tracer_container_cost_total";
pub(crate) const BILL: &str = "gpu_tracer_bill_total";
pub(crate) const POD_LABELS: &str = "gpu_tracer_pod_labels";
pub const PRICE: &str = "gpu_tracer_price_per_gpu_hour";

/// A series' labels (without `__name__`).
pub type Labels = BTreeMap<String, String>;

/// Pod labels by (namespace, pod), with the `label_` prefix removed.
pub(crate) type PodLabels = BTreeMap<(String, String), Labels>;

/// A currency amount as nano-currency; `None` for NaN or infinities.
pub(crate) fn to_nano(v: f64) -> Option<i128> {
    v.is_finite().then(|| (v * 1e9).round() as i128)
}

/// Add the labels of `gpu_tracer_pod_labels` series to `into`.
pub(crate) fn add_pod_labels<'a>(into: &mut PodLabels, rows: impl IntoIterator<Item = &'a Labels>) {
    for l in rows {
        let (Some(ns), Some(pod)) = (l.get("namespace"), l.get("pod")) else { continue };
        let e = into.entry((ns.clone(), pod.clone())).or_default();
        for (k, v) in l {
            if let Some(k) = k.strip_prefix("label_") {
                e.insert(k.to_owned(), v.clone());
            }
        }
    }
}

/// The cost series of one snapshot (one scrape, or the difference of two) as charges: one per
/// container series and one per other bill line; `node_of` names the node of a series. Warns
/// where a node's containers do not add up to its `containers` line (they do in every scrape).
pub fn charges(
    containers: &[(Labels, i128)],
    bill: &[(Labels, i128)],
    pods: &PodLabels,
    node_of: &dyn Fn(&Labels) -> String,
    warnings: &mut Vec<String>,
) -> Vec<Charge> {
    let mut out = Vec::new();
    let mut sum_by_node: BTreeMap<String, (i128, Option<i128>)> = BTreeMap::new();
    for (l, nano) in containers {
        let node = node_of(l);
        sum_by_node.entry(node.clone()).or_default().0 += nano;
        let get = |k: &str| l.get(k).cloned().unwrap_or_default();
        let (namespace, mut pod) = (get("namespace"), get("pod"));
        if pod.is_empty() {
            // Not a pod's container: its cgroup names it.
            pod = l.get("cgroup").cloned().unwrap_or_else(|| "(unknown)".into());
        }
        let labels = pods.get(&(namespace.clone(), pod.clone())).cloned().unwrap_or_default();
        out.push(Charge {
            node,
            line: Line::Container,
            namespace,
            pod,
            container: get("container"),
            labels,
            nano: *nano,
        });
    }
    for (l, nano) in bill {
        let node = node_of(l);
        match l.get("line").and_then(|s| Line::from_bill_label(s)) {
            Some(Line::Container) => {
                *sum_by_node.entry(node).or_default().1.get_or_insert(0) += nano;
            }
            Some(line) => out.push(Charge::line(&node, line, *nano)),
            None => warnings.push(format!("ignored a {BILL} series with an unknown line: {l:?}")),
        }
    }
    for (node, (sum, line)) in sum_by_node {
        if let Some(line) = line.filter(|&x| x != sum) {
            warnings.push(format!(
                "{node}: its containers add up to {} but its bill's containers line says {} (series missing from \
                 the source?)",
                tracer_core::cost::Cents(tracer_core::cost::round_cents(sum)),
                tracer_core::cost::Cents(tracer_core::cost::round_cents(line)),
            ));
        }
    }
    out
}

/// Why an agent's `/metrics` could not be read as a bill.
#[derive(Debug, thiserror::Error)]
pub enum ExpositionError {
    #[error("not a Prometheus text exposition: {0}")]
    Parse(String),
    #[error(
        "no {BILL} series: the agent computes no cost (set attribution.price_per_gpu_hour in its configuration; \
         the bill also needs NVML)"
    )]
    NoBill,
}

/// The bill since the agent started, from the text of its `/metrics` (the classic text format).
pub fn from_exposition(text: &str, node: &str, source: &str) -> Result<CostInput, ExpositionError> {
    let p =
        openmetrics_parser::prometheus::parse_prometheus(text).map_err(|e| ExpositionError::Parse(e.to_string()))?;
    let rows = |name: &str| -> Vec<(Labels, f64)> {
        let Some(f) = p.families.get(name) else { return Vec::new() };
        f.iter_samples()
            .filter_map(|s| {
                let labels: Labels =
                    s.get_labelset().ok()?.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
                let v = match &s.value {
                    PrometheusValue::Gauge(n) | PrometheusValue::Unknown(n) => n.as_f64(),
                    PrometheusValue::Counter(c) => c.value.as_f64(),
                    _ => return None,
                };
                Some((labels, v))
            })
            .collect()
    };
    let bill = rows(BILL);
    if bill.is_empty() {
        return Err(ExpositionError::NoBill);
    }
    let mut warnings = Vec::new();
    let nano = |rows: Vec<(Labels, f64)>, warnings: &mut Vec<String>| -> Vec<(Labels, i128)> {
        rows.into_iter()
            .filter_map(|(l, v)| {
                let n = to_nano(v);
                if n.is_none() {
                    warnings.push(format!("ignored a series whose value is {v}: {l:?}"));
                }
                n.map(|n| (l, n))
            })
            .collect()
    };
    let containers = nano(rows(CONTAINER_COST), &mut warnings);
    let bill = nano(bill, &mut warnings);
    let mut pods = PodLabels::new();
    let pod_rows = rows(POD_LABELS);
    add_pod_labels(&mut pods, pod_rows.iter().map(|(l, _)| l));
    let prices: BTreeSet<u64> =
        rows(PRICE).into_iter().filter(|(_, v)| v.is_finite()).map(|(_, v)| v.to_bits()).collect();
    let charges = charges(&containers, &bill, &pods, &|_| node.to_owned(), &mut warnings);
    Ok(CostInput {
        source: source.to_owned(),
        period: "since the agent started".into(),
        start_unix_s: None,
        end_unix_s: None,
        prices_per_gpu_hour: prices.into_iter().map(f64::from_bits).collect(),
        charges,
        warnings,
    })
}
