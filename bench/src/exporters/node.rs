//! The agent snapshot of section 6's 8-GPU × 100-container node, one per interval, as the agent
//! publishes it to its exporters: the attribution (an `Attributor` fed `attribution::node`, history
//! full), the NVML sample the attribution input stands for, the driver and CUDA ledgers of the 800
//! cgroups and their processes, each cgroup's container identity (Kubernetes cgroup path with pod UID
//! and container id, namespace, pod, container, owner, GPU request and allocation), and the agent's
//! own counters. What it leaves out: violations, allocation-vs-use rows, the ledger cross-check.
use std::{collections::BTreeMap, sync::Arc};

use tracer_core::{
    attribution::{Attributor, ContainerKey, GpuInput},
    config::AttachMode,
    cuda::ledger::{CudaCgroupRow, CudaSnapshot, CudaUsage},
    identity::{ContainerIdentity, KubeStatus},
    model::{
        Accounting, AgentSnapshot, KubeView, KubernetesStatus, NvmlStatus, NvmlView, PipelineStats,
        counters::{KernelCounters, ProbeCounters},
        probes::ProbeMode,
    },
    nvml::model::{Clocks, ComputeMode, DeviceSample, GpuProcess, NvmlSample, ProcessUtilization, Utilization},
    state::snapshot::{CgroupRow, GpuRow, ProcessRow, Snapshot, Totals, Usage},
};

use crate::attribution::{CONTAINERS_PER_GPU, GPUS};

const SEC: u64 = 1_000_000_000;
const MIB: u64 = 1 << 20;

/// Where container `g`, `i` of the node is: its pod UID, container id and cgroup path (a
/// burstable containerd pod under the systemd driver, as on a kubeadm node).
pub(crate) fn cgroup_of(key: ContainerKey) -> (String, String, String) {
    let n = key.0;
    let pod_uid = format!("{:08x}-5f60-7182-93a4-{:012x}", 0x1b2c_0000 + n, n * 7919);
    let id = format!("{:016x}", n.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let container_id = id.repeat(4);
    let path = format!(
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{container_id}.scope",
        pod_uid.replace('-', "_")
    );
    (pod_uid, container_id, path)
}

/// `g`, `i` of a container key of `attribution::node`.
fn place(key: ContainerKey) -> (u64, u64) {
    let n = key.0 - 10_000;
    (n / CONTAINERS_PER_GPU, n % CONTAINERS_PER_GPU)
}

/// The identity the agent would hold for a container of the node (Kubernetes and the kubelet's
/// allocations known).
fn identity(key: ContainerKey, gpu_uuid: &str) -> ContainerIdentity {
    let (g, i) = place(key);
    let (_, _, path) = cgroup_of(key);
    let mut id = ContainerIdentity::resolve(key.0, Some(&path), None, None);
    id.namespace = Some(format!("ns-{g}"));
    id.pod = Some(format!("pod-{i}-7d9f8b6c5"));
    id.container = Some("main".into());
    id.owner_kind = Some("ReplicaSet".into());
    id.owner_name = Some(format!("pod-{i}-7d9f8b6c5"));
    id.gpu_requests = [("nvidia.com/gpu".to_string(), 1)].into();
    id.allocated_gpus = vec![format!("{gpu_uuid}::{i}")];
    id.allocations_known = true;
    id
}

/// Feeds an attributor the node and makes the agent snapshot of each interval.
pub(crate) struct NodeFeed {
    attributor: Attributor,
    t: u64,
    start_ns: u64,
    containers: BTreeMap<u64, ContainerIdentity>,
}

impl NodeFeed {
    /// An attributor whose rightsizing history is full (as after a long run).
    pub(crate) fn new() -> NodeFeed {
        let settings = crate::attribution::settings();
        let mut attributor = Attributor::new(&settings);
        let (start_ns, _) = crate::attribution::fill_history(&mut attributor, &settings);
        NodeFeed { attributor, t: 0, start_ns, containers: BTreeMap::new() }
    }

    /// The next interval's snapshot (one second long).
    pub(crate) fn next(&mut self) -> AgentSnapshot {
        let t = self.t;
        self.t += 1;
        let input = crate::attribution::node(t, self.start_ns + t * SEC, SEC);
        let attribution = self.attributor.update(&input);
        if self.containers.is_empty() {
            for gpu in &input.gpus {
                for k in gpu.processes.iter().filter_map(|p| p.container) {
                    self.containers.insert(k.0, identity(k, &gpu.uuid));
                }
            }
        }
        AgentSnapshot {
            state: ledger(&input.gpus, t),
            cuda: cuda(&input.gpus, t),
            kernel: kernel(t),
            pipeline: PipelineStats { received: 20_000 * t, decoded: 20_000 * t, ..Default::default() },
            accounting: Accounting {
                seen: 20_000 * t,
                received: 20_000 * t,
                aggregated: 0,
                dropped: 0,
                in_flight: 0,
                exact: true,
            },
            attach_mode: ProbeMode::Attached(AttachMode::BtfTracepoint),
            driver_version: "550.54.15".into(),
            nvml: NvmlView {
                status: NvmlStatus::Ready,
                library: Some("libnvidia-ml.so.1".into()),
                driver_version: Some("550.54.15".into()),
                nvml_version: Some("12.550.54.15".into()),
                samples: t + 1,
                sample: Some(Arc::new(nvml_sample(&input.gpus, t, self.start_ns + (t + 1) * SEC))),
                ..Default::default()
            },
            attribution: Some(Arc::new(attribution)),
            containers: self.containers.clone(),
            kubernetes: KubeView {
                status: KubernetesStatus::Running,
                detail: "watching pods on gpu-node-01".into(),
                watcher: Some(KubeStatus {
                    node: "gpu-node-01".into(),
                    server: "https://10.96.0.1:443".into(),
                    connected: true,
                    ready: true,
                    pods_cached: (GPUS * CONTAINERS_PER_GPU) as usize,
                    ..Default::default()
                }),
                pod_resources: None,
            },
            ..Default::default()
        }
    }
}

/// What NVML would have said for this input: per GPU, identity, memory, utilization, power,
/// energy, clocks, the process list and one utilization sample per process.
fn nvml_sample(gpus: &[GpuInput], t: u64, taken_unix_ns: u64) -> NvmlSample {
    let devices = gpus
        .iter()
        .enumerate()
        .map(|(g, gpu)| DeviceSample {
            index: g as u32,
            uuid: gpu.uuid.clone(),
            name: gpu.name.clone(),
            minor: gpu.minor,
            pci_bus_id: Some(format!("00000000:{:02X}:00.0", 0x18 + g * 0x10)),
            memory: gpu.memory,
            utilization: gpu.sm_activity_pct.map(|p| Utilization { gpu_pct: p, memory_pct: 30 }),
            power_mw: Some(450_000),
            energy_mj: Some(1_000_000_000 + t * 450_000),
            clocks: Clocks { graphics_mhz: Some(1_980), sm_mhz: Some(1_980), memory_mhz: Some(3_201) },
            temperature_c: Some(55),
            compute_mode: Some(ComputeMode::Default),
            mig_enabled: Some(false),
            processes: gpu
                .processes
                .iter()
                .map(|p| GpuProcess { pid: p.pid, used_bytes: p.nvml_used_bytes, compute: true, ..Default::default() })
                .collect(),
            process_utilization: gpu
                .processes
                .iter()
                .filter_map(|p| {
                    Some(ProcessUtilization {
                        pid: p.pid,
                        timestamp_us: taken_unix_ns / 1_000,
                        sm_pct: (p.nvml_sm_pct? * 100.0) as u32 / 100,
                        mem_pct: 10,
                        ..Default::default()
                    })
                })
                .collect(),
            ..Default::default()
        })
        .collect();
    NvmlSample {
        taken_unix_ns,
        taken_mono_ns: taken_unix_ns,
        driver_version: Some("550.54.15".into()),
        nvml_version: Some("12.550.54.15".into()),
        cuda_driver_version: Some(12040),
        devices,
        missing: vec![],
        cost_ns: 2_000_000,
    }
}

/// The driver ledger: one row per cgroup and per process (its bytes on its GPU), per GPU, totals.
fn ledger(gpus: &[GpuInput], t: u64) -> Snapshot {
    let mut s = Snapshot::default();
    for gpu in gpus {
        let mut on_gpu = Usage::default();
        for p in &gpu.processes {
            let Some(k) = p.container else { continue };
            let u = Usage {
                vidmem_bytes: p.driver_ledger_bytes.unwrap_or(0),
                sysmem_bytes: 64 * MIB,
                va_reserved_bytes: 8 << 30,
                live_allocations: 40,
                allocations: 40 + t,
                frees: t,
                ioctls: 10_000 + 500 * t,
                ..Default::default()
            };
            on_gpu.vidmem_bytes += u.vidmem_bytes;
            on_gpu.sysmem_bytes += u.sysmem_bytes;
            on_gpu.va_reserved_bytes += u.va_reserved_bytes;
            on_gpu.live_allocations += u.live_allocations;
            on_gpu.allocations += u.allocations;
            on_gpu.frees += u.frees;
            on_gpu.ioctls += u.ioctls;
            let (_, _, path) = cgroup_of(k);
            s.cgroups.push(CgroupRow {
                cgroup_id: k.0,
                path: Some(path),
                processes: 1,
                removed: false,
                usage: u,
                completeness: Default::default(),
            });
            s.processes.push(ProcessRow {
                tgid: p.pid,
                start_time_ticks: 1_000 + p.pid as u64,
                comm: Some("python3".into()),
                cgroup_id: k.0,
                fds: 3,
                gpu_minors: gpu.minor.into_iter().collect(),
                clients: 1,
                handles: 64,
                usage: u,
                completeness: Default::default(),
            });
        }
        s.totals.usage.vidmem_bytes += on_gpu.vidmem_bytes;
        s.totals.usage.sysmem_bytes += on_gpu.sysmem_bytes;
        s.totals.usage.va_reserved_bytes += on_gpu.va_reserved_bytes;
        s.totals.usage.live_allocations += on_gpu.live_allocations;
        s.totals.usage.allocations += on_gpu.allocations;
        s.totals.usage.frees += on_gpu.frees;
        s.totals.usage.ioctls += on_gpu.ioctls;
        s.gpus.push(GpuRow { minor: gpu.minor, usage: on_gpu, completeness: Default::default() });
    }
    s.cgroups.sort_by_key(|c| c.cgroup_id);
    s.processes.sort_by_key(|p| p.tgid);
    s.totals = Totals {
        usage: s.totals.usage,
        processes: s.processes.len(),
        cgroups: s.cgroups.len(),
        live_allocations: s.totals.usage.live_allocations as usize,
        completeness: Default::default(),
    };
    for (op, n) in [("rm_alloc", 40), ("rm_free", 1), ("rm_control", 400), ("map_memory", 20)] {
        s.counters.ioctls_by_op.insert(op, n * 800 * (t + 1));
    }
    s.counters.ioctls_by_device.insert("ctl", 461 * 800 * (t + 1));
    s.counters.events.insert("ioctl", 461 * 800 * (t + 1));
    s
}

/// The CUDA ledger: per cgroup, live device bytes and cumulative launches.
fn cuda(gpus: &[GpuInput], t: u64) -> CudaSnapshot {
    let mut c = CudaSnapshot::default();
    for gpu in gpus {
        for p in &gpu.processes {
            let Some(k) = p.container else { continue };
            let launches = gpu.launches.get(&k).copied().unwrap_or(0) * (t + 1);
            let usage = CudaUsage {
                device_bytes: p.cuda_ledger_bytes.unwrap_or(0),
                launches,
                launch_rate: launches as f64 / (t + 1) as f64,
                allocs: 40,
                ..Default::default()
            };
            c.cgroups.push(CudaCgroupRow { cgroup_id: k.0, path: Some(cgroup_of(k).2), usage });
        }
    }
    c.cgroups.sort_by_key(|r| r.cgroup_id);
    c.calls_by_entry.insert("cuLaunchKernel", c.cgroups.iter().map(|r| r.usage.launches).sum());
    c.calls_by_entry.insert("cuMemAlloc_v2", 40 * c.cgroups.len() as u64);
    c
}

/// The kernel's per-probe counters of an agent attached with btf tracepoints.
fn kernel(t: u64) -> KernelCounters {
    let probes = ["ioctl", "openat", "close", "dup", "mmap", "munmap", "sched_process_exec", "sched_process_exit"];
    KernelCounters {
        probes: probes
            .iter()
            .map(|p| {
                let n = 20_000 * t;
                ((*p).to_string(), ProbeCounters { seen: n, emitted: n, ..Default::default() })
            })
            .collect(),
    }
}
