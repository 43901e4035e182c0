//! The Kubernetes families: whether the pod watcher and the kubelet pod-resources work
//! (`kubernetes_up`, `pod_resources_up`), the watcher's cache and errors, the refreshes; and the
//! pods' allow-listed labels (`pod_labels`).
use std::{collections::BTreeMap, fmt};

use super::{MetricEncoder, Scrape, counter, gauge, gauge_family};

/// Whether the Kubernetes sides (pod watcher, kubelet pod-resources) work.
pub fn kubernetes(s: &Scrape<'_>, e: &mut dyn MetricEncoder) -> fmt::Result {
    let k = &s.snapshot.kubernetes;
    let watcher_up = k.watcher.as_ref().is_some_and(|w| w.connected && w.ready);
    gauge(
        e,
        "kubernetes_up",
        "1 when the pod watcher is connected and has listed the node's pods, else 0 (also when off).",
        None,
        u64::from(watcher_up),
    )?;
    let pr_up = k.pod_resources.as_ref().is_some_and(|p| p.available);
    gauge(
        e,
        "pod_resources_up",
        "1 when the last kubelet pod-resources refresh succeeded, else 0 (also when off).",
        None,
        u64::from(pr_up),
    )?;
    if let Some(w) = &k.watcher {
        gauge(e, "kubernetes_pods_cached", "Pods of this node in the watcher's cache.", None, w.pods_cached as u64)?;
        counter(e, "kubernetes_watch_errors", "Errors the pod watcher met (list, watch, reconnect).", None, w.errors)?;
        counter(e, "kubernetes_relists", "Complete pod lists after the first one.", None, w.relists)?;
    }
    if let Some(p) = &k.pod_resources {
        counter(e, "pod_resources_refreshes", "Successful kubelet pod-resources refreshes.", None, p.refreshes)?;
        counter(e, "pod_resources_failures", "Failed kubelet pod-resources refreshes.", None, p.failures)?;
    }
    Ok(())
}

/// `label_<name>` for pod label `name`, as kube-state-metrics names them (`kube_pod_labels`):
/// every character that may not be in a label name becomes `_`.
fn label_name(key: &str) -> String {
    let mut out = String::with_capacity(6 + key.len());
    out.push_str("label_");
    out.extend(key.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }));
    out
}

/// `pod_labels`: one series per pod of a traced container, carrying its allow-listed labels
/// (`kubernetes.label_allow_list`) as `label_*` labels, to be joined on `namespace, pod`
/// (e.g. cost per team). Labels never go on the per-container series themselves: a label change
/// would start new series of every family.
pub fn pod_labels(s: &Scrape<'_>, e: &mut dyn MetricEncoder) -> fmt::Result {
    let mut pods: BTreeMap<(&str, &str), Vec<(String, String)>> = BTreeMap::new();
    for id in s.snapshot.containers.values() {
        let (Some(ns), Some(pod)) = (id.namespace.as_deref(), id.pod.as_deref()) else { continue };
        pods.entry((ns, pod)).or_insert_with(|| {
            // Two keys that sanitise alike ("a.b", "a_b"): the first (sorted) wins.
            let mut seen = std::collections::BTreeSet::new();
            id.labels.iter().map(|(k, v)| (label_name(k), v.clone())).filter(|(k, _)| seen.insert(k.clone())).collect()
        });
    }
    gauge_family(
        e,
        "pod_labels",
        "Allow-listed labels (kubernetes.label_allow_list) of each pod with a traced container, as label_<name>; value 1.",
        None,
        pods.into_iter().map(|((ns, pod), labels)| {
            let mut l = vec![("namespace".to_string(), ns.to_string()), ("pod".to_string(), pod.to_string())];
            l.extend(labels);
            (l, 1u64)
        }),
    )
}
