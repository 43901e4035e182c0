//! Guardrail violations: counts per kind, uses that could not be checked, one series per violation.
use std::{collections::BTreeMap, fmt};

use super::{LabelSet, MetricEncoder, Scrape, counter, counter_family, gauge_family};
use tracer_core::guardrails::ViolationKind;

/// Labels of one violation series.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct ViolationLabels {
    kind: &'static str,
    namespace: String,
    pod: String,
    container: String,
    /// The MIG device, else the physical GPU's UUID, else `minor:N`; empty for all GPUs.
    gpu: String,
}

impl LabelSet for ViolationLabels {
    fn visit(&self, label: &mut dyn FnMut(&str, &str) -> fmt::Result) -> fmt::Result {
        label("kind", self.kind)?;
        label("namespace", &self.namespace)?;
        label("pod", &self.pod)?;
        label("container", &self.container)?;
        label("gpu", &self.gpu)
    }
}

/// Guardrail violations: counts per kind (every kind, also at 0), uses that could not be checked,
/// and one series per violation raised.
pub fn violations(s: &Scrape<'_>, e: &mut dyn MetricEncoder) -> fmt::Result {
    let c = &s.snapshot.violation_counts;
    counter_family(
        e,
        "violations",
        "GPU uses outside the container's allocation raised so far, by kind (each once per container, GPU and kind).",
        None,
        ViolationKind::ALL.map(|k| ([("kind", k.as_str())], c.get(k))),
    )?;
    counter(
        e,
        "violations_unresolved",
        "GPU uses that could not be checked (the GPU or an allocation could not be tied to a physical GPU).",
        None,
        c.unresolved,
    )?;
    let rows: BTreeMap<ViolationLabels, u64> = s
        .snapshot
        .violations
        .iter()
        .map(|v| {
            let gpu = v.gpu.as_ref().map_or_else(String::new, |g| match (&g.mig_uuid, &g.uuid, g.minor) {
                (Some(m), _, _) => m.clone(),
                (None, Some(u), _) => u.clone(),
                (None, None, Some(m)) => format!("minor:{m}"),
                (None, None, None) => String::new(),
            });
            let l = ViolationLabels {
                kind: v.kind.as_str(),
                namespace: v.namespace.clone(),
                pod: v.pod.clone(),
                container: v.container.clone(),
                gpu,
            };
            (l, 1)
        })
        .collect();
    gauge_family(e, "violation_info", "One series per violation raised (kind, pod, GPU); value 1.", None, rows)
}
