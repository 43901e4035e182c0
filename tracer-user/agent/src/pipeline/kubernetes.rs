//! The Kubernetes side of the agent: the pod watcher for this node and the kubelet pod-resources
//! poller, both optional, started once inside the tokio runtime.
use std::{sync::Arc, time::Duration};

use super::StartError;
use crate::{
    allocation::source::AllocationSource,
    identity::kube::{KubeStart, PodCache, PodWatcher},
};
use tracer_core::{
    allocation::GpuAllocations,
    config::KubeSettings,
    model::{KubeView, KubernetesStatus},
};

/// How often the kubelet's allocations are read again.
const POD_RESOURCES_EVERY: Duration = Duration::from_secs(5);

/// The pod watcher and the kubelet pod-resources poller, and where they stand.
#[derive(Default)]
pub(super) struct KubeSide {
    started: bool,
    status: KubernetesStatus,
    detail: String,
    /// Kept so the watch runs as long as the agent.
    _watcher: Option<PodWatcher>,
    pub(super) pods: Option<PodCache>,
    allocations: Option<AllocationSource>,
}

impl KubeSide {
    /// Start both (once). In `auto` mode whatever is missing is reported (`kubernetes` in the
    /// snapshot, `doctor`) and the agent goes on; in `required` mode it fails.
    pub(super) async fn start(&mut self, settings: &KubeSettings) -> Result<(), StartError> {
        if self.started {
            return Ok(());
        }
        self.started = true;
        let start = PodWatcher::start(settings).await?;
        self.detail = start.describe();
        self.status = match &start {
            KubeStart::Off => KubernetesStatus::Off,
            KubeStart::NotInUse { .. } => KubernetesStatus::NotInUse,
            KubeStart::Unavailable { .. } => KubernetesStatus::Unavailable,
            KubeStart::Running(_) => KubernetesStatus::Running,
        };
        match &start {
            KubeStart::Running(_) | KubeStart::NotInUse { .. } | KubeStart::Off => tracing::info!("{}", self.detail),
            KubeStart::Unavailable { .. } => tracing::warn!("Kubernetes identity: {}", self.detail),
        }
        self.pods = start.cache();
        if let KubeStart::Running(w) = start {
            self._watcher = Some(w);
        }
        // pod-resources only makes sense on a Kubernetes node: off when Kubernetes is, and on a
        // plain host (not in use) only if a kubelet socket is there after all.
        let on_node = self.status != KubernetesStatus::NotInUse || settings.pod_resources_socket.exists();
        if self.status != KubernetesStatus::Off && on_node {
            self.allocations = AllocationSource::start(settings, POD_RESOURCES_EVERY).await?;
        }
        Ok(())
    }

    /// The kubelet's latest allocations, when known.
    pub(super) fn allocations(&self) -> Option<Arc<GpuAllocations>> {
        self.allocations.as_ref().and_then(|a| a.current())
    }

    /// Read the kubelet's allocations now (instead of waiting for the next poll).
    pub(super) async fn refresh_allocations(&self) {
        if let Some(a) = &self.allocations {
            let _ = a.refresh().await;
        }
    }

    /// The model's view.
    pub(super) fn view(&self) -> KubeView {
        KubeView {
            status: self.status,
            detail: self.detail.clone(),
            watcher: self.pods.as_ref().map(|c| c.status()),
            pod_resources: self.allocations.as_ref().map(|a| a.status()),
        }
    }
}
