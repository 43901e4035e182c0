//! The join stage: once per NVML sample, what the eBPF ledgers, the NVML sample and identity know
//! about every GPU process, put together for the attribution engine (per-GPU lines that add up)
//! and for the guardrails (GPU use outside the kubelet's allocations).
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
};

use super::Agent;
use tracer_core::{
    allocation::{GpuAllocations, GpuDevice},
    attribution::{AttributionSnapshot, Attributor, ContainerInput, ContainerKey, ProcessLedgers, ProcessOwner},
    config::Config,
    cuda::ledger::CudaSnapshot,
    guardrails::{GpuMap, GpuProcessObservation, Guardrails, Violation, VisibleDevices},
    identity::ContainerIdentity,
    model::AllocationUse,
    nvml::model::NvmlSample,
    state::Snapshot,
};

/// The comm the MPS control daemon's server has (15 bytes of `nvidia-cuda-mps-server`).
const MPS_SERVER_COMM: &str = "nvidia-cuda-mps";

/// Violations kept for the snapshot (`violation_info`, `top`, the API) whatever Kubernetes says:
/// the most recent; `violations_total` and the event stream have every one.
const MAX_VIOLATIONS: usize = 1024;

/// Keep the violations of pods still listed (when the list is known, i.e. not empty), and at most
/// the `max` most recent: a pod that is gone takes its violations with it, as it takes what the
/// guardrails raised for it.
fn prune_violations(violations: &mut Vec<Violation>, live: Option<&BTreeSet<(String, String)>>, max: usize) {
    if let Some(live) = live.filter(|l| !l.is_empty()) {
        violations.retain(|v| live.contains(&(v.namespace.clone(), v.pod.clone())));
    }
    let over = violations.len().saturating_sub(max);
    violations.drain(..over);
}

/// What the join stage keeps between intervals: the attribution engine and its latest result,
/// the guardrails and what they raised, allocated-vs-used per container.
pub(super) struct Join {
    attributor: Attributor,
    pub(super) attribution: Option<Arc<AttributionSnapshot>>,
    /// Cumulative launches per cgroup at the previous attribution (for per-interval deltas).
    launches_at_last_sample: HashMap<u64, u64>,
    guardrails: Guardrails,
    pub(super) violations: Vec<Violation>,
    /// Violations not yet taken by `take_new_violations` (the event stream).
    pub(super) new_violations: Vec<Violation>,
    /// `NVIDIA_VISIBLE_DEVICES` / `CUDA_VISIBLE_DEVICES` per (pid, start time), read once.
    visible_devices: HashMap<(u32, u64), VisibleDevices>,
    pub(super) allocation_use: Vec<AllocationUse>,
}

impl Join {
    pub(super) fn new(cfg: &Config) -> Join {
        Join {
            attributor: Attributor::new(&cfg.attribution),
            attribution: None,
            launches_at_last_sample: HashMap::new(),
            guardrails: Guardrails::new(cfg.dev_dir.clone()),
            violations: Vec::new(),
            new_violations: Vec::new(),
            visible_devices: HashMap::new(),
            allocation_use: Vec::new(),
        }
    }

    /// Violations raised so far, by kind.
    pub(super) fn violation_counts(&self) -> tracer_core::guardrails::ViolationCounts {
        self.guardrails.counts()
    }
}

impl Agent {
    /// One interval: NVML's latest sample joined with the ledgers and identity → attribution; and
    /// the guardrails on the same observations.
    pub(super) fn attribute(&mut self, state: &Snapshot, cuda: &CudaSnapshot) {
        let Some(sample) = self.nvml.last.clone() else { return };
        let prev = self.nvml.prev.clone();
        // Every PID either side knows.
        let mut pids: BTreeSet<u32> = state.processes.iter().map(|p| p.tgid).collect();
        for d in &sample.devices {
            pids.extend(d.processes.iter().map(|p| p.pid));
            for m in &d.mig_instances {
                pids.extend(m.processes.iter().map(|p| p.pid));
            }
        }
        let allocs = self.kube.allocations();
        let mut owners: BTreeMap<u32, ProcessOwner> = BTreeMap::new();
        let mut cgroup_of: BTreeMap<u32, u64> = BTreeMap::new();
        let mut containers: BTreeMap<ContainerKey, ContainerInput> = BTreeMap::new();
        let mut idents: BTreeMap<u64, Arc<ContainerIdentity>> = BTreeMap::new();
        for pid in &pids {
            let cg = process_row(state, *pid).map(|p| p.cgroup_id).filter(|c| *c != 0);
            let Some(cg) = cg.or_else(|| self.enrich.cgroup_id_of(*pid)) else {
                owners.insert(*pid, ProcessOwner::default());
                continue;
            };
            cgroup_of.insert(*pid, cg);
            // One resolution per cgroup per interval, however many processes it has.
            let ident = match idents.get(&cg) {
                Some(i) => Arc::clone(i),
                None => {
                    let i = self.identities.resolve(cg, &mut self.enrich.cgroups, &self.kube);
                    idents.insert(cg, Arc::clone(&i));
                    i
                }
            };
            let comm = self.comm_of(*pid, state);
            let is_mps_server = comm.as_deref().is_some_and(|c| c.starts_with(MPS_SERVER_COMM));
            let container = (ident.is_container() && !is_mps_server).then_some(ContainerKey(cg));
            let name = ident.display_name();
            if let Some(k) = container {
                containers.entry(k).or_insert_with(|| ContainerInput {
                    name: Some(name.clone()),
                    request: ident.gpu_request(allocs.as_deref()),
                });
            }
            owners.insert(*pid, ProcessOwner { container, display_name: Some(name), is_mps_server });
        }
        // Launches per container since the previous sample.
        let mut launches: BTreeMap<ContainerKey, u64> = BTreeMap::new();
        for row in &cuda.cgroups {
            let total = row.usage.launches + row.usage.graph_launches;
            let before = self.join.launches_at_last_sample.insert(row.cgroup_id, total).unwrap_or(0);
            let delta = total.saturating_sub(before);
            if delta > 0 {
                launches.insert(ContainerKey(row.cgroup_id), delta);
            }
        }
        let ledger_of = |pid: u32, minor: Option<u32>| ledgers_of(state, cuda, pid, minor);
        let mut input = tracer_core::attribution::input_from_sample(
            &sample,
            prev.as_deref(),
            |pid| owners.get(&pid).cloned(),
            ledger_of,
            &launches,
        );
        // Names and requests the adapter does not know; the kubelet's share of each GPU.
        for (k, c) in containers {
            let e = input.containers.entry(k).or_default();
            e.name = e.name.take().or(c.name);
            e.request = c.request;
        }
        if let Some(a) = allocs.as_deref() {
            for g in &mut input.gpus {
                let keys: BTreeSet<ContainerKey> = g.processes.iter().filter_map(|p| p.container).collect();
                for k in keys {
                    let ident = self.identities.get(k.0);
                    if let Some(f) = ident.and_then(|i| i.requested_fraction_of(&g.uuid, Some(a))) {
                        g.requested_fraction.insert(k, f);
                    }
                }
            }
        }
        let snap = self.join.attributor.update(&input);
        self.join.attribution = Some(Arc::new(snap));
        self.check_guardrails(state, &sample, &cgroup_of, allocs);
    }

    fn comm_of(&mut self, pid: u32, state: &Snapshot) -> Option<String> {
        if let Some(c) = process_row(state, pid).and_then(|p| p.comm.clone()) {
            return Some(c);
        }
        self.enrich.process_now(pid).map(|i| i.comm)
    }

    /// Observations of every GPU process in a container → new violations; and allocated vs used.
    fn check_guardrails(
        &mut self,
        state: &Snapshot,
        sample: &NvmlSample,
        cgroup_of: &BTreeMap<u32, u64>,
        allocs: Option<Arc<GpuAllocations>>,
    ) {
        let Some(allocs) = allocs else {
            self.join.allocation_use.clear();
            return;
        };
        let map = GpuMap::from_nvml(sample);
        let mut nvml_uuids: BTreeMap<u32, Vec<String>> = BTreeMap::new();
        for d in &sample.devices {
            for p in &d.processes {
                nvml_uuids.entry(p.pid).or_default().push(d.uuid.clone());
            }
            for m in &d.mig_instances {
                for p in &m.processes {
                    nvml_uuids.entry(p.pid).or_default().push(m.uuid.clone());
                }
            }
        }
        let mut obs = Vec::new();
        let mut used: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
        for (pid, cg) in cgroup_of {
            let Some(ident) = self.identities.get(*cg).cloned() else { continue };
            let ident: &ContainerIdentity = &ident;
            let Some(cref) = ident.container_ref() else { continue };
            let row = process_row(state, *pid);
            let opened: Vec<tracer_core::decode::Device> = row
                .map(|r| {
                    r.gpu_minors
                        .iter()
                        .map(|m| tracer_core::decode::Device {
                            kind: tracer_core::decode::DeviceKind::Gpu,
                            minor: *m,
                            file_id: 0,
                        })
                        .collect()
                })
                .unwrap_or_default();
            let uuids = nvml_uuids.get(pid).cloned().unwrap_or_default();
            let u = used.entry(*cg).or_default();
            u.extend(uuids.iter().cloned());
            for d in &opened {
                if let Some(g) = map.by_minor(d.minor) {
                    u.insert(g.uuid.clone());
                }
            }
            let start = row.map_or(0, |r| r.start_time_ticks);
            let proc_root = self.cfg.proc_root.clone();
            let visible = self
                .join
                .visible_devices
                .entry((*pid, start))
                .or_insert_with(|| tracer_core::guardrails::read_visible_devices(&proc_root, *pid).unwrap_or_default())
                .clone();
            obs.push(GpuProcessObservation {
                pid: *pid,
                container: Some(cref),
                opened,
                nvml_uuids: uuids,
                visible_devices: visible,
            });
        }
        let live: BTreeSet<u32> = cgroup_of.keys().copied().collect();
        self.join.visible_devices.retain(|(pid, _), _| live.contains(pid));
        // A pod that is gone takes its raised violations with it (a new pod of the same name is
        // a new workload and is checked afresh).
        let live_pods: Option<BTreeSet<(String, String)>> =
            self.kube.pods.as_ref().map(|pods| pods.pods().into_iter().map(|p| (p.namespace, p.name)).collect());
        if let Some(live) = live_pods.as_ref().filter(|l| !l.is_empty()) {
            self.join.guardrails.retain_containers(|c| live.contains(&(c.namespace.clone(), c.pod.clone())));
        }
        let new = self.join.guardrails.evaluate(&obs, &map, &allocs);
        for v in &new {
            tracing::warn!(
                kind = v.kind.as_str(),
                namespace = %v.namespace,
                pod = %v.pod,
                container = %v.container,
                pid = v.pid,
                "GPU guardrail violation"
            );
        }
        self.join.violations.extend(new.iter().cloned());
        prune_violations(&mut self.join.violations, live_pods.as_ref(), MAX_VIOLATIONS);
        self.join.new_violations.extend(new);
        // Allocated vs used, per container with a name.
        let mut rows = Vec::new();
        for (cg, used) in used {
            let Some(ident) = self.identities.get(cg) else { continue };
            let allocated_gpus: BTreeSet<String> = ident
                .container_ref()
                .map(|c| allocs.for_container(&c).iter().filter_map(|g| physical_uuid(&map, &g.device)).collect())
                .unwrap_or_default();
            // Using a MIG instance means opening its parent's /dev/nvidiaN: the parent of an
            // allocated instance is not outside the allocation (another pod's instance is).
            let allocated_parents: BTreeSet<String> =
                allocated_gpus.iter().filter_map(|u| map.mig(u).map(|(p, _)| p.uuid.clone())).collect();
            let outside: Vec<String> = used
                .iter()
                .filter(|u| {
                    !allocated_gpus.contains(*u)
                        && !allocated_parents.contains(*u)
                        && !map.mig(u).is_some_and(|(parent, _)| allocated_gpus.contains(&parent.uuid))
                })
                .cloned()
                .collect();
            rows.push(AllocationUse {
                cgroup_id: cg,
                name: ident.display_name(),
                allocated: ident.allocated_gpus.clone(),
                allocated_gpus: allocated_gpus.into_iter().collect(),
                used_gpus: used.into_iter().collect(),
                outside_allocation: outside,
            });
        }
        self.join.allocation_use = rows;
    }
}

/// The GPU (or MIG device) UUID a kubelet device id names, through NVML's map.
fn physical_uuid(map: &GpuMap, d: &GpuDevice) -> Option<String> {
    match d {
        GpuDevice::Gpu { uuid } | GpuDevice::Mig { uuid } => Some(uuid.clone()),
        GpuDevice::MigLegacy { parent_uuid, .. } => Some(parent_uuid.clone()),
        GpuDevice::Index { index } => map.by_index(*index).map(|g| g.uuid.clone()),
        GpuDevice::MigIndex { parent_index, .. } => map.by_index(*parent_index).map(|g| g.uuid.clone()),
        GpuDevice::DraGpu { minor, .. } => map.by_minor(*minor).map(|g| g.uuid.clone()),
        GpuDevice::Unrecognised { .. } => None,
    }
}

/// `pid`'s row of the state snapshot (its processes are sorted by tgid).
fn process_row(state: &Snapshot, pid: u32) -> Option<&tracer_core::state::snapshot::ProcessRow> {
    state.processes.binary_search_by_key(&pid, |p| p.tgid).ok().map(|i| &state.processes[i])
}

/// The eBPF ledgers' device bytes of `pid` on GPU `minor`: known exactly when the process has
/// only that GPU open (the driver ledger is per process, not per process and GPU).
fn ledgers_of(state: &Snapshot, cuda: &CudaSnapshot, pid: u32, minor: Option<u32>) -> ProcessLedgers {
    let row = process_row(state, pid);
    let single = |minors: &[u32]| minors.len() == 1 && Some(minors[0]) == minor;
    let driver_bytes = row.filter(|r| single(&r.gpu_minors)).map(|r| r.usage.vidmem_bytes);
    let cuda_bytes = row
        .filter(|r| single(&r.gpu_minors))
        .and_then(|_| cuda.processes.binary_search_by_key(&pid, |c| c.tgid).ok().map(|i| &cuda.processes[i]))
        .map(|c| c.usage.device_bytes);
    ProcessLedgers { driver_bytes, cuda_bytes }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_core::guardrails::{Evidence, ViolationKind};

    fn violation(pod: &str) -> Violation {
        Violation {
            kind: ViolationKind::ALL[0],
            namespace: "ns".into(),
            pod: pod.into(),
            container: "c".into(),
            pid: 1,
            gpu: None,
            evidence: Evidence::default(),
        }
    }

    /// Found by the soak: the violations of every pod ever seen stayed in the snapshot (and as
    /// `violation_info` series) for ever.
    #[test]
    fn violations_of_gone_pods_go_and_the_list_is_bounded() {
        let mut v: Vec<Violation> = ["a", "b", "c"].map(violation).to_vec();
        let live: BTreeSet<(String, String)> = [("ns".to_string(), "b".to_string())].into();
        prune_violations(&mut v, Some(&live), 10);
        assert_eq!(v.iter().map(|v| v.pod.as_str()).collect::<Vec<_>>(), ["b"]);
        // An empty or unknown pod list says nothing about which pods are gone.
        let mut v: Vec<Violation> = ["a", "b"].map(violation).to_vec();
        prune_violations(&mut v, Some(&BTreeSet::new()), 10);
        prune_violations(&mut v, None, 10);
        assert_eq!(v.len(), 2);
        // Whatever Kubernetes says, the most recent `max` stay.
        let mut v: Vec<Violation> = (0..5).map(|i| violation(&format!("p{i}"))).collect();
        prune_violations(&mut v, None, 3);
        assert_eq!(v.iter().map(|v| v.pod.as_str()).collect::<Vec<_>>(), ["p2", "p3", "p4"]);
    }
}
