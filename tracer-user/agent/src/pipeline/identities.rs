//! Who each cgroup is (container, pod, allocated GPUs), resolved at most once per interval and
//! cached for the events in between.
use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use super::kubernetes::KubeSide;
use crate::enrich::CgroupResolver;
use tracer_core::identity::ContainerIdentity;

/// The identities resolved, by cgroup id.
#[derive(Default)]
pub(super) struct Identities {
    by_cgroup: BTreeMap<u64, Arc<ContainerIdentity>>,
}

impl Identities {
    /// Who cgroup `id` is, resolved now (cheap: a path parse and cache lookups) and cached.
    pub(super) fn resolve(&mut self, id: u64, cgroups: &mut CgroupResolver, kube: &KubeSide) -> Arc<ContainerIdentity> {
        let path = cgroups.resolve(id);
        let allocs = kube.allocations();
        let ident = Arc::new(ContainerIdentity::resolve(
            id,
            path.as_deref(),
            kube.pods.as_ref().map(|p| p as &dyn tracer_core::identity::PodLookup),
            allocs.as_deref(),
        ));
        self.by_cgroup.insert(id, ident.clone());
        ident
    }

    /// The identity resolved at the last interval (or now, for a cgroup not seen yet); `None` for
    /// cgroup 0 (unknown).
    pub(super) fn cached(
        &mut self,
        id: u64,
        cgroups: &mut CgroupResolver,
        kube: &KubeSide,
    ) -> Option<Arc<ContainerIdentity>> {
        if id == 0 {
            return None;
        }
        match self.by_cgroup.get(&id) {
            Some(i) => Some(i.clone()),
            None => Some(self.resolve(id, cgroups, kube)),
        }
    }

    /// The identity cached for cgroup `id`, if any.
    pub(super) fn get(&self, id: u64) -> Option<&Arc<ContainerIdentity>> {
        self.by_cgroup.get(&id)
    }

    /// Resolve every cgroup of `ids` again and forget the others (bounded: only what the state or
    /// the attribution still knows is kept).
    pub(super) fn refresh(
        &mut self,
        ids: BTreeSet<u64>,
        cgroups: &mut CgroupResolver,
        kube: &KubeSide,
    ) -> BTreeMap<u64, ContainerIdentity> {
        self.by_cgroup.retain(|k, _| ids.contains(k));
        ids.into_iter().map(|id| (id, (*self.resolve(id, cgroups, kube)).clone())).collect()
    }

    /// The cgroup of container `namespace/pod/container`, among those resolved.
    pub(super) fn cgroup_of_container(&self, namespace: &str, pod: &str, container: &str) -> Option<u64> {
        self.by_cgroup.iter().find_map(|(id, c)| {
            (c.namespace.as_deref() == Some(namespace)
                && c.pod.as_deref() == Some(pod)
                && c.container.as_deref() == Some(container))
            .then_some(*id)
        })
    }
}
