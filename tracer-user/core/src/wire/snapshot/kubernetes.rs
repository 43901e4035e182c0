//! Where Kubernetes identity stands: the pod watcher and the kubelet's pod-resources poller.
use gpu_tracer_proto::v1;

use crate::{
    allocation::AllocationStatus,
    identity::KubeStatus,
    model::{KubeView, KubernetesStatus},
};

use super::{
    Result,
    codec::{Enum, FromProto, Opt, Path, ToProto, to_usize, wire_enum, wire_message},
};

wire_enum!(KubernetesStatus => KubernetesStatus [NotStarted, Running, NotInUse, Unavailable, Off]);

wire_message! {
    KubeView => KubernetesView {
        status: Enum,
        detail,
        watcher: Opt,
        pod_resources: Opt,
    }
}

// By hand: the message says "DRA discovered" apart from the versions found.
impl ToProto for KubeStatus {
    type Proto = v1::PodWatcher;

    fn to_proto(&self) -> v1::PodWatcher {
        v1::PodWatcher {
            node: self.node.clone(),
            server: self.server.clone(),
            connected: self.connected,
            ready: self.ready,
            last_error: self.last_error.clone(),
            errors: self.errors,
            relists: self.relists,
            pods_cached: self.pods_cached as u64,
            dra_discovered: self.dra_versions.is_some(),
            dra_versions: self.dra_versions.clone().unwrap_or_default(),
        }
    }
}

impl FromProto for KubeStatus {
    fn from_proto(w: v1::PodWatcher) -> Result<Self> {
        Ok(KubeStatus {
            node: w.node,
            server: w.server,
            connected: w.connected,
            ready: w.ready,
            last_error: w.last_error,
            errors: w.errors,
            relists: w.relists,
            pods_cached: to_usize(w.pods_cached),
            dra_versions: w.dra_discovered.then_some(w.dra_versions),
        })
    }
}

wire_message! {
    AllocationStatus => PodResourcesPoller {
        socket: Path,
        available,
        last_success_unix_ns,
        last_error,
        allocatable_error,
        refreshes,
        failures,
    }
}
