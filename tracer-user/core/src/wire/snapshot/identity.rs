//! Who each cgroup is (its container identity and GPU requests), and each container's allocated
//! vs used GPUs.
use std::collections::BTreeMap;

use gpu_tracer_proto::v1;

use crate::{identity::ContainerIdentity, model::AllocationUse, wire::events::container_proto};

use super::{
    Result,
    codec::{Codec, Map, non_empty, required, static_name, wire_message},
};

/// `ContainerIdentity::kind` (identity/container's `kind_str`, and "unknown" without a path).
const CONTAINER_KINDS: &[&str] = &["container", "container-monitor", "pod", "host", "other", "unknown"];
/// `ContainerIdentity::runtime`.
const RUNTIMES: &[&str] = &["containerd", "cri-o", "docker"];
/// `ContainerIdentity::qos`.
const QOS_CLASSES: &[&str] = &["guaranteed", "burstable", "best-effort"];

/// The identities by cgroup id as `Container`s (the identity itself is the events' form,
/// `wire::events::container_proto`). Back, names outside the known kinds, runtimes and QoS
/// classes become [`OTHER`](super::OTHER), empty strings `None`.
pub(super) struct ByCgroup;

impl Codec<BTreeMap<u64, ContainerIdentity>, Vec<v1::Container>> for ByCgroup {
    fn write(&self, v: &BTreeMap<u64, ContainerIdentity>) -> Vec<v1::Container> {
        v.iter()
            .map(|(&cgroup_id, c)| v1::Container {
                cgroup_id,
                cgroup_path: c.cgroup_path.clone(),
                identity: Some(container_proto(c)),
                gpu_requests: Map.write(&c.gpu_requests),
            })
            .collect()
    }

    fn read(&self, p: Vec<v1::Container>, _: &'static str) -> Result<BTreeMap<u64, ContainerIdentity>> {
        p.into_iter().map(container_from_proto).collect()
    }
}

fn container_from_proto(c: v1::Container) -> Result<(u64, ContainerIdentity)> {
    let id = required(c.identity, "Container.identity")?;
    let identity = ContainerIdentity {
        cgroup_id: c.cgroup_id,
        cgroup_path: c.cgroup_path,
        kind: static_name(&id.kind, CONTAINER_KINDS),
        runtime: (!id.runtime.is_empty()).then(|| static_name(&id.runtime, RUNTIMES)),
        container_id: non_empty(id.container_id),
        pod_uid: non_empty(id.pod_uid),
        qos: (!id.qos.is_empty()).then(|| static_name(&id.qos, QOS_CLASSES)),
        namespace: non_empty(id.namespace),
        pod: non_empty(id.pod),
        container: non_empty(id.container),
        owner_kind: non_empty(id.owner_kind),
        owner_name: non_empty(id.owner_name),
        labels: id.labels.into_iter().collect(),
        gpu_requests: Map.read(c.gpu_requests, "Container.gpu_requests")?,
        allocated_gpus: id.allocated_gpus,
        allocations_known: id.allocations_known,
    };
    Ok((c.cgroup_id, identity))
}

wire_message! {
    AllocationUse => AllocationUse {
        cgroup_id,
        name,
        allocated,
        allocated_gpus,
        used_gpus,
        outside_allocation,
    }
}
