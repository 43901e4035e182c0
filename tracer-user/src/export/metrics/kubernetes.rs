//! The Kubernetes families: whether the pod watcher and the kubelet pod-resources work
//! (`kubernetes_up`, `pod_resources_up`), the watcher's cache and errors, the refreshes.
use std::fmt;

use prometheus_client::encoding::DescriptorEncoder;

use super::{Scrape, counter, gauge};

/// Whether the Kubernetes sides (pod watcher, kubelet pod-resources) work.
pub fn kubernetes(s: &Scrape<'_>, e: &mut DescriptorEncoder<'_>) -> fmt::Result {
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
