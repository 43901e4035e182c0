//! The snapshot as a message: what `top --connect` renders from it is what a local `top` renders,
//! the attribution's lines add up on the message itself, prost round-trips it, and bad messages are
//! named errors.
use std::{collections::BTreeMap, path::PathBuf, sync::Arc};

use gpu_tracer_proto::prost::Message;
use proptest::prelude::*;

use super::*;
use crate::{
    attribution::{
        AttributionInput, Attributor, ContainerInput, GpuInput, ProcessInput,
        gpu::FULL,
        input::{EnergyInput, EnergySource},
    },
    config::AttributionSettings,
    decode::{DecodeError, DeviceKind},
    export::{
        attribution_table::render_attribution,
        top::{RenderOptions, render},
    },
    model::probes::EntryReport,
};

const GIB: u64 = 1 << 30;
const SEC: u64 = 1_000_000_000;
const T0: u64 = 1_700_000_000 * SEC;
const GPU0: &str = "GPU-aaaaaaaa-1111-2222-3333-444444444444";
const GPU1: &str = "GPU-bbbbbbbb-1111-2222-3333-444444444444";
const MIG1: &str = "MIG-cccccccc-1111-2222-3333-444444444444";
const GPU2: &str = "GPU-dddddddd-1111-2222-3333-444444444444";

fn process(pid: u32, container: Option<u64>, used: u64, sm: Option<f64>) -> ProcessInput {
    ProcessInput {
        pid,
        container: container.map(ContainerKey),
        nvml_used_bytes: Some(used),
        nvml_sm_pct: sm,
        ..Default::default()
    }
}

fn memory(total: u64, used: u64) -> Option<MemoryInfo> {
    Some(MemoryInfo { total, reserved: GIB / 2, used, free: total - used })
}

/// A whole GPU shared by two containers and a host process, a MIG instance, the unpartitioned
/// slices of its GPU (no memory reading, no energy), and a lost GPU.
fn gpu_inputs() -> Vec<GpuInput> {
    let whole = GpuInput {
        uuid: GPU0.into(),
        index: Some(0),
        name: Some("NVIDIA H200".into()),
        minor: Some(0),
        share_of_gpu_ppm: 1_000_000,
        memory: memory(140 * GIB, 40 * GIB),
        sm_activity_pct: Some(80),
        energy: Some(EnergyInput { delta_mj: 612_345, source: EnergySource::Counter }),
        processes: vec![
            process(101, Some(1001), 20 * GIB, Some(40.0)),
            process(102, Some(1002), 10 * GIB, Some(0.0)),
            process(9, None, GIB, Some(5.0)),
        ],
        ..Default::default()
    };
    let mig = GpuInput {
        uuid: MIG1.into(),
        parent_uuid: Some(GPU1.into()),
        index: Some(1),
        name: Some("NVIDIA H200 MIG 3g.71gb".into()),
        minor: Some(1),
        mig_profile: Some("3g.71gb".into()),
        share_of_gpu_ppm: 428_571,
        memory: memory(71 * GIB, 6 * GIB),
        energy: Some(EnergyInput { delta_mj: 30_001, source: EnergySource::ParentShare }),
        processes: vec![process(201, Some(1003), 5 * GIB, None)],
        launches: [(ContainerKey(1003), 500)].into_iter().collect(),
        ..Default::default()
    };
    let slices = GpuInput {
        uuid: GPU1.into(),
        parent_uuid: Some(GPU1.into()),
        index: Some(1),
        minor: Some(1),
        mig_profile: Some("unpartitioned".into()),
        share_of_gpu_ppm: 571_429,
        ..Default::default()
    };
    let lost =
        GpuInput { uuid: GPU2.into(), index: Some(2), share_of_gpu_ppm: 1_000_000, lost: true, ..Default::default() };
    vec![whole, mig, slices, lost]
}

/// Two intervals on [`gpu_inputs`], with a price, requests, an idle reservation and rightsizing.
fn attribution() -> AttributionSnapshot {
    let containers: BTreeMap<ContainerKey, ContainerInput> = [
        (1001, "team-a/train-0/main", GpuRequest::WholeGpus { count: 1 }),
        (1002, "team-b/serve-1/main", GpuRequest::Fraction { fraction: 0.25 }),
        (1003, "team-c/notebook/main", GpuRequest::MigProfile { profile: "3g.71gb".into(), count: 1 }),
    ]
    .into_iter()
    .map(|(k, n, r)| (ContainerKey(k), ContainerInput { name: Some(n.into()), request: Some(r) }))
    .collect();
    let settings =
        AttributionSettings { price_per_gpu_hour: Some(3.49), idle_reservation_after_s: 0, ..Default::default() };
    let mut a = Attributor::new(&settings);
    let input = |start| AttributionInput {
        start_unix_ns: start,
        interval_ns: SEC,
        gpus: gpu_inputs(),
        containers: containers.clone(),
    };
    a.update(&input(T0));
    a.update(&input(T0 + SEC))
}

fn usage(vidmem_gib: u64, ioctls: u64) -> Usage {
    Usage {
        vidmem_bytes: vidmem_gib * GIB,
        sysmem_bytes: 64 << 20,
        managed_bytes: 2 << 20,
        live_allocations: 12,
        allocations: 40,
        frees: 28,
        ioctls,
        failed_calls: 1,
        ..Default::default()
    }
}

fn pod_path(i: u64) -> String {
    format!(
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{i:08x}_aaaa_bbbb_cccc_dddddddddddd.slice/cri-containerd-{i:064x}.scope"
    )
}

fn driver_ledger() -> DriverSnapshot {
    let mut s = DriverSnapshot::default();
    for (i, id) in [1001u64, 1002, 1003].into_iter().enumerate() {
        let u = usage(20 - 5 * i as u64, 1000 + i as u64);
        s.cgroups.push(CgroupRow {
            cgroup_id: id,
            path: Some(pod_path(id)),
            processes: 1,
            removed: false,
            usage: u,
            completeness: Completeness {
                from_before_agent: i as u32 % 2,
                records_lost_since_unix_ns: None,
                nvml_bytes_from_before_agent: (i % 2 == 1).then_some(1 << 30),
            },
        });
        s.processes.push(ProcessRow {
            tgid: 101 + 100 * i as u32,
            start_time_ticks: 4242,
            comm: Some("python3".into()),
            cgroup_id: id,
            fds: 4,
            gpu_minors: vec![i as u32 % 2],
            clients: 1,
            handles: 17,
            usage: u,
            completeness: Completeness {
                from_before_agent: i as u32 % 2,
                records_lost_since_unix_ns: (i == 2).then_some(1_764_640_000_000_000_000),
                nvml_bytes_from_before_agent: None,
            },
        });
    }
    let host = usage(1, 77);
    s.cgroups.push(CgroupRow {
        cgroup_id: 7,
        path: Some("/system.slice/dcgm.service".into()),
        processes: 0,
        removed: true,
        usage: host,
        completeness: Default::default(),
    });
    s.processes.push(ProcessRow {
        tgid: 9,
        start_time_ticks: 0,
        comm: None,
        cgroup_id: 7,
        fds: 2,
        gpu_minors: vec![],
        clients: 1,
        handles: 3,
        usage: host,
        completeness: Default::default(),
    });
    s.gpus = vec![
        GpuRow { minor: Some(0), usage: usage(30, 2000), completeness: Default::default() },
        GpuRow { minor: Some(1), usage: usage(10, 1000), completeness: Default::default() },
        GpuRow { minor: None, usage: usage(1, 77), completeness: Default::default() },
    ];
    s.totals = Totals {
        usage: usage(41, 3077),
        processes: 4,
        cgroups: 4,
        live_allocations: 48,
        completeness: Completeness {
            from_before_agent: 1,
            records_lost_since_unix_ns: Some(1_764_640_000_000_000_000),
            nvml_bytes_from_before_agent: Some(1 << 30),
        },
    };
    let c = &mut s.counters;
    c.events = [("ioctl", 3077), ("fd_opened", 14), ("process_exit", 2)].into_iter().collect();
    c.ioctls_by_op = [("rm_alloc", 160), ("rm_control", 2900), ("malformed", 2)].into_iter().collect();
    c.ioctls_by_device = [("ctl", 3000), ("gpu", 70), ("uvm", 7)].into_iter().collect();
    c.failed_by_op = [("rm_control", 4)].into_iter().collect();
    c.malformed_by_reason = [("fault_main", 2)].into_iter().collect();
    c.released_by = [("free", 100), ("process_exit", 12)].into_iter().collect();
    c.rm_control_by_cmd = [(0x2080_014a, 17)].into_iter().collect();
    c.rm_control_other = 3;
    c.allocations = 160;
    c.frees = 112;
    c.unknown_gpu_attributions = 1;
    s
}

fn cuda_ledger() -> CudaSnapshot {
    let u = |launches: u64, rate: f64| CudaUsage {
        device_bytes: 18 * GIB,
        managed_bytes: GIB,
        host_bytes: 4 << 20,
        launches,
        graph_launches: launches / 100,
        launch_rate: rate,
        allocs: 30,
        frees: 20,
        failed_allocs: 1,
    };
    CudaSnapshot {
        cgroups: vec![
            CudaCgroupRow { cgroup_id: 1001, path: Some(pod_path(1001)), usage: u(987_654, 1234.5) },
            CudaCgroupRow { cgroup_id: 1003, path: None, usage: u(500, 0.25) },
        ],
        processes: vec![
            CudaProcessRow { tgid: 101, cgroup_id: 1001, usage: u(987_654, 1234.5) },
            CudaProcessRow { tgid: 201, cgroup_id: 1003, usage: u(500, 0.25) },
        ],
        totals: u(988_154, 1234.75),
        calls_by_entry: [("cuLaunchKernel", 988_154), ("cuMemAlloc_v2", 60)].into_iter().collect(),
        unknown_frees: 2,
    }
}

fn nvml_sample() -> NvmlSample {
    let device = |index: u32, uuid: &str| DeviceSample {
        index,
        uuid: uuid.into(),
        name: Some("NVIDIA H200".into()),
        minor: Some(index),
        pci_bus_id: Some(format!("00000000:0{index}:00.0")),
        memory: memory(140 * GIB, 40 * GIB),
        utilization: Some(Utilization { gpu_pct: 80, memory_pct: 31 }),
        power_mw: Some(412_000),
        energy_mj: Some(9_876_543_210),
        mig_enabled: Some(false),
        ..Default::default()
    };
    let mut mig = device(1, GPU1);
    mig.mig_enabled = Some(true);
    mig.utilization = None;
    mig.mig_instances = vec![MigInstance {
        index: 0,
        uuid: MIG1.into(),
        gpu_instance_id: Some(2),
        compute_instance_id: Some(0),
        name: Some("NVIDIA H200 MIG 3g.71gb".into()),
        memory: memory(71 * GIB, 6 * GIB),
        ..Default::default()
    }];
    mig.missing = vec![Missing { what: "utilization".into(), reason: "NotSupported".into() }];
    let lost = DeviceSample { index: 2, uuid: GPU2.into(), lost: true, ..Default::default() };
    NvmlSample {
        taken_unix_ns: T0 + 2 * SEC,
        driver_version: Some("550.54.15".into()),
        nvml_version: Some("12.550.54.15".into()),
        cuda_driver_version: Some(12040),
        devices: vec![device(0, GPU0), mig, lost],
        cost_ns: 3_500_000,
        ..Default::default()
    }
}

fn identity(id: u64, pod: &str) -> ContainerIdentity {
    ContainerIdentity {
        cgroup_id: id,
        cgroup_path: Some(pod_path(id)),
        kind: "container",
        runtime: Some("containerd"),
        container_id: Some(format!("{id:064x}")),
        pod_uid: Some(format!("{id:08x}-aaaa-bbbb-cccc-dddddddddddd")),
        qos: Some("burstable"),
        namespace: Some(pod.split('/').next().unwrap_or_default().into()),
        pod: Some(pod.split('/').nth(1).unwrap_or_default().into()),
        container: Some("main".into()),
        owner_kind: Some("Deployment".into()),
        owner_name: Some("serve".into()),
        labels: [("app".to_string(), "serve".to_string())].into_iter().collect(),
        gpu_requests: [("nvidia.com/gpu".to_string(), 1)].into_iter().collect(),
        allocated_gpus: vec![format!("{GPU0}::2")],
        allocations_known: true,
    }
}

fn violations() -> Vec<Violation> {
    let v = |kind, pod: &str, gpu| Violation {
        kind,
        namespace: "team-b".into(),
        pod: pod.into(),
        container: "main".into(),
        pid: 102,
        gpu,
        evidence: Evidence {
            device_path: Some(PathBuf::from("/dev/nvidia2")),
            nvml_uuid: None,
            visible_devices: VisibleDevices { nvidia: Some("all".into()), cuda: None },
            allocated: vec![format!("{GPU0}::2")],
        },
    };
    let physical = GpuRef { uuid: Some(GPU2.into()), minor: Some(2), index: Some(2), mig_uuid: None };
    let on_mig = GpuRef { mig_uuid: Some(MIG1.into()), ..Default::default() };
    vec![
        v(ViolationKind::UnallocatedGpuOpen, "serve-1", Some(physical)),
        v(ViolationKind::UnallocatedGpuInNvml, "serve-1", Some(on_mig)),
        v(ViolationKind::VisibleDevicesAllWithoutRequest, "sidecar", None),
    ]
}

fn kubernetes() -> KubeView {
    KubeView {
        status: KubernetesStatus::Running,
        detail: "pods of node gpu-7 from https://10.0.0.1:443 (31 cached)".into(),
        watcher: Some(KubeStatus {
            node: "gpu-7".into(),
            server: "https://10.0.0.1:443".into(),
            connected: true,
            ready: true,
            last_error: Some("watch: 410 Gone".into()),
            errors: 1,
            relists: 1,
            pods_cached: 31,
            dra_versions: Some(vec!["v1beta1".into()]),
        }),
        pod_resources: Some(AllocationStatus {
            socket: PathBuf::from("/var/lib/kubelet/pod-resources/kubelet.sock"),
            available: true,
            last_success_unix_ns: Some(T0),
            last_error: None,
            allocatable_error: Some("Unimplemented".into()),
            refreshes: 40,
            failures: 2,
        }),
    }
}

fn kernel_counters() -> KernelCounters {
    let mut ioctl = ProbeCounters { seen: 3100, emitted: 3077, ..Default::default() };
    ioctl.set_dropped(tracer_common::counter::DROP_RINGBUF_FULL, 20);
    ioctl.set_dropped(tracer_common::counter::DROP_NO_ENTRY, 3);
    let cuda = ProbeCounters { seen: 988_154, aggregated: 988_154, ..Default::default() };
    KernelCounters { probes: vec![("ioctl".into(), ioctl), ("cuda_call".into(), cuda)] }
}

/// A node with everything: several GPUs, containers, MIG and unknown buckets, violations, NVML
/// ready, a price.
fn rich() -> AgentSnapshot {
    AgentSnapshot {
        state: driver_ledger(),
        cuda: cuda_ledger(),
        ledger_check: vec![LedgerCheck {
            tgid: 101,
            cgroup_id: 1001,
            cuda_device_bytes: 18 * GIB,
            driver_vidmem_bytes: 20 * GIB,
            driver_minus_cuda: 2 * GIB as i64,
        }],
        kernel: kernel_counters(),
        pipeline: PipelineStats {
            received: 3077,
            decoded: 3076,
            decode_errors: [("short", 1)].into_iter().collect(),
            seeded_fds: 6,
            cuda_libraries_found: 1,
            ..Default::default()
        },
        accounting: Accounting {
            seen: 991_254,
            received: 3077,
            aggregated: 988_154,
            dropped: 23,
            in_flight: 2,
            exact: false,
        },
        attach_mode: ProbeMode::Attached(AttachMode::BtfTracepoint),
        driver_version: "550.54.15".into(),
        nvml: NvmlView {
            status: NvmlStatus::Ready,
            reason: None,
            library: Some("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1".into()),
            driver_version: Some("550.54.15".into()),
            nvml_version: Some("12.550.54.15".into()),
            failed_readings: [("not_supported", 7), ("gpu_lost", 1)].into_iter().collect(),
            samples: 42,
            sample: Some(Arc::new(nvml_sample())),
        },
        attribution: Some(Arc::new(attribution())),
        containers: [
            (1001, identity(1001, "team-a/train-0")),
            (1002, identity(1002, "team-b/serve-1")),
            (1003, identity(1003, "team-c/notebook")),
        ]
        .into_iter()
        .collect(),
        allocation_use: vec![AllocationUse {
            cgroup_id: 1002,
            name: "team-b/serve-1/main".into(),
            allocated: vec![format!("{GPU0}::2")],
            allocated_gpus: vec![GPU0.into()],
            used_gpus: vec![GPU0.into(), GPU2.into()],
            outside_allocation: vec![GPU2.into()],
        }],
        violations: violations(),
        violation_counts: ViolationCounts {
            unallocated_gpu_open: 1,
            unallocated_gpu_in_nvml: 1,
            visible_devices_all_without_request: 1,
            unresolved: 4,
            ..Default::default()
        },
        kubernetes: kubernetes(),
        ..Default::default()
    }
}

fn round_trip(s: &AgentSnapshot) -> AgentSnapshot {
    snapshot_from_proto(snapshot_to_proto(s, T0 + 2 * SEC)).expect("a message the agent made is valid")
}

#[test]
fn top_and_the_attribution_table_render_the_same_from_the_message() {
    let s = rich();
    let back = round_trip(&s);
    for per_process in [true, false] {
        for width in [80, 160] {
            let o = RenderOptions { per_process, width };
            assert_eq!(render(&back, &o), render(&s, &o), "per_process {per_process}, width {width}");
        }
    }
    let (a, b) = (s.attribution.as_deref().expect("attributed"), back.attribution.as_deref().expect("restored"));
    for width in [80, 160] {
        assert_eq!(render_attribution(b, width), render_attribution(a, width));
    }
    assert_eq!(a, b, "the attribution comes back whole");
    assert_eq!(back.state, s.state, "the driver ledger comes back whole");
    assert_eq!(back.cuda, s.cuda);
    assert_eq!(back.kernel, s.kernel);
    assert_eq!(back.violations, s.violations);
    assert_eq!(back.containers, s.containers);
    // The fixture shows what it is meant to: every kind of block and line.
    let out = render(&s, &RenderOptions { per_process: true, width: 160 });
    if std::env::var_os("SHOW_TOP").is_some() {
        println!("{out}");
    }
    for part in ["bill so far", "MIG 3g.71gb", "unknown-gpu", "GPU guardrail violations: 3", "CUDA (libcuda)", "↓ "] {
        assert!(out.contains(part), "{part} missing:\n{out}");
    }
}

#[test]
fn everything_the_message_carries_survives_a_second_round_trip() {
    let p = snapshot_to_proto(&rich(), T0);
    let again = snapshot_to_proto(&snapshot_from_proto(p.clone()).expect("valid"), T0);
    assert_eq!(again, p);
    assert_eq!(p.interval_ns, SEC);
    assert_eq!(p.taken_at_unix_ns, T0);
}

/// Every group of lines adds up on the message itself, as a client that only has the proto would
/// check it; so do each container's memory and cost across GPUs, and the bill.
#[test]
fn attribution_lines_add_up_on_the_message() {
    let p = snapshot_to_proto(&rich(), T0);
    let a = p.attribution.expect("attributed");
    assert_eq!(a.gpus.len(), 4);
    for g in &a.gpus {
        let lines = &g.containers;
        if let Some(m) = &g.memory {
            let sum: u64 =
                lines.iter().map(|l| l.memory_bytes).sum::<u64>() + m.driver_reserved + m.unattributed + m.free;
            assert_eq!(sum, m.total, "memory of {}", g.uuid);
            assert_eq!(
                m.unattributed_host_processes + m.unattributed_mps_server + m.unattributed_other,
                m.unattributed
            );
        }
        let c = g.compute.as_ref().expect("compute lines");
        let sm: u64 = lines.iter().map(|l| u64::from(l.sm_millipct)).sum::<u64>() + u64::from(c.unattributed + c.idle);
        assert_eq!(sm, u64::from(FULL), "compute of {}", g.uuid);
        if let Some(e) = &g.energy {
            let sum: u64 =
                lines.iter().map(|l| l.energy_mj.expect("energy line")).sum::<u64>() + e.unattributed + e.idle;
            assert_eq!(sum, e.delta_mj, "energy of {}", g.uuid);
        }
        let k = g.cost.as_ref().expect("a price is configured");
        let sum: u64 = lines.iter().map(|l| l.cost_nano.expect("cost line")).sum::<u64>()
            + k.idle
            + k.driver_reserved
            + k.unattributed;
        assert_eq!(sum, k.price_nano, "cost of {}", g.uuid);
    }
    assert!(a.gpus.iter().any(|g| g.memory.is_none() && g.energy.is_none()), "a GPU without readings");
    for c in &a.containers {
        let lines = a.gpus.iter().flat_map(|g| &g.containers).filter(|l| l.cgroup_id == c.cgroup_id);
        let (memory, cost) = lines.fold((0, 0), |(m, k), l| (m + l.memory_bytes, k + l.cost_nano.unwrap_or(0)));
        assert_eq!((memory, cost), (c.memory_bytes, c.cost_nano), "container {}", c.cgroup_id);
    }
    let b = a.bill.expect("bill");
    let containers: u64 = a.containers.iter().map(|c| c.cumulative_cost_nano).sum();
    assert!(b.total > 0);
    assert_eq!(containers + b.evicted + b.idle + b.driver_reserved + b.unattributed, b.total);
}

#[test]
fn prost_encoding_is_lossless() {
    let p = snapshot_to_proto(&rich(), T0);
    let bytes = p.encode_to_vec();
    assert_eq!(v1::Snapshot::decode(bytes.as_slice()).expect("decodes"), p);
    let status = status_to_proto(&rich(), &report(FamilyStatus::Disabled), "0.1.0", T0);
    assert_eq!(v1::AgentStatus::decode(status.encode_to_vec().as_slice()).expect("decodes"), status);
}

/// The message of [`rich`], changed by `f`, read back.
fn read_changed(f: impl FnOnce(&mut v1::Snapshot)) -> Result<AgentSnapshot> {
    let mut p = snapshot_to_proto(&rich(), T0);
    f(&mut p);
    snapshot_from_proto(p)
}

fn first_gpu(p: &mut v1::Snapshot) -> &mut v1::GpuAttribution {
    &mut p.attribution.as_mut().expect("attributed").gpus[0]
}

#[test]
fn bad_messages_are_named_errors() {
    let err = |f: fn(&mut v1::Snapshot)| read_changed(f).expect_err("invalid");
    assert_eq!(
        err(|p| first_gpu(p).sharing = 99),
        SnapshotError::InvalidEnum { field: "GpuAttribution.sharing", value: 99 }
    );
    assert_eq!(err(|p| p.attach_mode = 0), SnapshotError::Unspecified { field: "Snapshot.attach_mode" });
    assert_eq!(err(|p| p.attach_mode = -3), SnapshotError::InvalidEnum { field: "Snapshot.attach_mode", value: -3 });
    assert_eq!(
        err(|p| p.nvml.as_mut().expect("nvml").status = 0),
        SnapshotError::Unspecified { field: "NvmlView.status" }
    );
    assert_eq!(err(|p| p.driver = None), SnapshotError::Missing { field: "Snapshot.driver" });
    assert_eq!(err(|p| p.kubernetes = None), SnapshotError::Missing { field: "Snapshot.kubernetes" });
    assert_eq!(err(|p| first_gpu(p).compute = None), SnapshotError::Missing { field: "GpuAttribution.compute" });
    assert_eq!(
        err(|p| first_gpu(p).cost.as_mut().expect("cost").basis = 42),
        SnapshotError::InvalidEnum { field: "CostLines.basis", value: 42 }
    );
    assert_eq!(
        err(|p| p.driver.as_mut().expect("driver").cgroups[0].usage = None),
        SnapshotError::Missing { field: "DriverCgroup.usage" }
    );
    let e = err(|p| {
        let a = p.attribution.as_mut().expect("attributed");
        let r = a.containers.iter_mut().find_map(|c| c.rightsizing.as_mut()).expect("rightsizing");
        r.fit = Some(v1::Fit { fit: None });
    });
    assert_eq!(e, SnapshotError::Missing { field: "Fit.fit" });
    assert_eq!(e.reason(), "missing");
    let e = err(|p| p.violations[0].violation.as_mut().expect("violation").kind = "borrowed_gpu".into());
    assert_eq!(e, SnapshotError::UnknownName { field: "Violation.kind", value: "borrowed_gpu".into() });
    assert_eq!(e.to_string(), "Violation.kind = \"borrowed_gpu\" is not a name this build knows");
}

#[test]
fn names_this_build_does_not_know_are_counted_under_other() {
    let back = read_changed(|p| {
        let pipeline = p.pipeline.as_mut().expect("pipeline");
        pipeline.decode_errors.insert("from_the_future".into(), 5);
        pipeline.decode_errors.insert("from_the_past".into(), 2);
        let driver = p.driver.as_mut().expect("driver");
        driver.counters.as_mut().expect("counters").malformed_by_reason.insert("new_fault".into(), 3);
        let probe = &mut p.kernel_probes[0];
        probe.dropped_by_reason.insert("new_drop".into(), 100);
        p.containers[0].identity.as_mut().expect("identity").runtime = "podman".into();
    })
    .expect("valid");
    assert_eq!(back.pipeline.decode_errors, [("short", 1), (OTHER, 7)].into_iter().collect());
    assert_eq!(back.state.counters.malformed_by_reason, [("fault_main", 2), (OTHER, 3)].into_iter().collect());
    assert_eq!(back.kernel, kernel_counters(), "an unknown drop reason has no slot");
    assert_eq!(back.containers[&1001].runtime, Some(OTHER));
}

/// The name lists kept here for `&'static str` maps hold every name their source can give.
#[test]
fn the_name_lists_match_their_sources() {
    let decode_errors = [
        DecodeError::Short { kind: 0, need: 1, got: 0 },
        DecodeError::UnknownKind { kind: 0 },
        DecodeError::BadRecordSize { kind: 0, declared: 0, expected: 1 },
        DecodeError::BadLength { field: "len", len: 2, max: 1 },
    ];
    for e in decode_errors {
        assert!(DECODE_ERROR_REASONS.contains(&e.reason()), "{}", e.reason());
    }
    for k in 0..=u8::MAX {
        let name = DeviceKind::from_wire(k).as_str();
        assert!(DEVICE_KINDS.contains(&name), "{name}");
    }
    use nvml_wrapper::error::NvmlError as E;
    let nvml = [
        E::NotSupported,
        E::GpuLost,
        E::NoPermission,
        E::FailedToLoadSymbol("x".into()),
        E::Uninitialized,
        E::InvalidArg,
        E::NotFound,
        E::InsufficientSize(None),
        E::DriverNotLoaded,
        E::ResetRequired,
        E::Timeout,
        E::Unknown,
        E::InUse,
    ];
    for e in &nvml {
        let name = crate::nvml::sampler::reason_label(e);
        assert!(NVML_FAILURE_REASONS.contains(&name), "{name}");
    }
}

fn report(cuda: FamilyStatus) -> ProbeReport {
    ProbeReport {
        features: KernelFeatures {
            release: "6.8.0-45-generic".into(),
            btf: true,
            tracefs: true,
            kprobes: true,
            nvidia_module: true,
            syscall_tracepoints: false,
            driver_entry: None,
            driver_entry_detail: String::new(),
        },
        attach_mode: ProbeMode::Attached(AttachMode::BtfTracepoint),
        attach_reason: "BTF present: tp_btf sys_enter/sys_exit".into(),
        driver_abi: "nvos64-48".into(),
        driver: FamilyStatus::Attached { programs: vec!["sys_enter".into(), "sys_exit".into()] },
        lifecycle: FamilyStatus::Failed { error: "sched_process_exec: permission denied".into() },
        cuda,
        cuda_libraries: vec![LibraryReport {
            path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
            inode: 1234,
            method: crate::model::probes::Method::UprobeMulti,
            method_detail: String::new(),
            uprobes: 1,
            links: 1,
            entries: vec![
                EntryReport { symbol: "cuLaunchKernel", status: "attached", detail: "at 0x1a2b0".into() },
                EntryReport { symbol: "cuMemCreate", status: "missing", detail: String::new() },
            ],
        }],
        device_check: Default::default(),
    }
}

#[test]
fn the_status_names_each_family_state() {
    let s = rich();
    let family = |f: &Option<v1::ProbeFamily>| f.clone().expect("family");
    for (cuda, state, error) in [
        (FamilyStatus::Disabled, v1::FamilyState::Disabled, ""),
        (
            FamilyStatus::NothingToProbe { error: "no libcuda.so.1".into() },
            v1::FamilyState::NothingToProbe,
            "no libcuda.so.1",
        ),
        (FamilyStatus::Failed { error: "uprobe: EINVAL".into() }, v1::FamilyState::Failed, "uprobe: EINVAL"),
        (FamilyStatus::Attached { programs: vec!["cuda_call".into()] }, v1::FamilyState::Attached, ""),
    ] {
        let st = status_to_proto(&s, &report(cuda.clone()), "0.1.0", T0);
        let c = family(&st.cuda);
        assert_eq!((c.state(), c.error.as_str()), (state, error), "{cuda:?}");
        assert_eq!(c.programs, if let FamilyStatus::Attached { programs } = cuda { programs } else { vec![] });
        let d = family(&st.driver);
        assert_eq!((d.state(), d.programs.len()), (v1::FamilyState::Attached, 2));
        assert_eq!(family(&st.lifecycle).state(), v1::FamilyState::Failed);
        assert_eq!(st.agent_version, "0.1.0");
        assert_eq!(st.attach_mode(), v1::AttachMode::BtfTracepoint);
        assert_eq!((st.driver_version.as_str(), st.driver_abi.as_str()), ("550.54.15", "nvos64-48"));
        assert_eq!(st.cuda_libraries[0].entries[1].status, "missing");
        assert_eq!(st.cuda_libraries[0].method, "uprobe-multi");
        assert_eq!((st.nvml_status(), st.nvml_reason.as_deref()), (v1::NvmlStatus::Ready, None));
        assert_eq!(st.kubernetes_status(), v1::KubernetesStatus::Running);
        assert_eq!(st.accounting.as_ref().map(|a| (a.seen, a.in_flight, a.exact)), Some((991_254, 2, false)));
        assert_eq!(st.pipeline.as_ref().map(|p| p.decoded), Some(3076));
        assert_eq!(st.snapshot_taken_at_unix_ns, T0);
        assert!(st.kernel.as_ref().is_some_and(|k| k.btf && !k.syscall_tracepoints));
    }
    let nvml_only = status_to_proto(&AgentSnapshot::default(), &ProbeReport::nvml_only(Default::default()), "0.1.0", 0);
    assert_eq!(nvml_only.attach_mode(), v1::AttachMode::NvmlOnly);
    assert_eq!(nvml_only.nvml_status(), v1::NvmlStatus::NotStarted);
}

#[test]
fn an_empty_agent_round_trips() {
    let s = AgentSnapshot::default();
    let back = round_trip(&s);
    assert!(back.attribution.is_none() && back.nvml.sample.is_none());
    let o = RenderOptions { per_process: true, width: 80 };
    assert_eq!(render(&back, &o), render(&s, &o));
}

proptest! {
    /// Any bytes: decoding and reading back give a value or an error, never a panic.
    #[test]
    fn any_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(p) = v1::Snapshot::decode(bytes.as_slice()) {
            let _ = snapshot_from_proto(p);
        }
    }

    /// Any enum number in the attribution is either read or named as the field it is in.
    #[test]
    fn any_enum_number_is_read_or_named(sharing in any::<i32>(), basis in any::<i32>()) {
        let r = read_changed(|p| {
            let g = first_gpu(p);
            g.sharing = sharing;
            if let Some(c) = g.cost.as_mut() {
                c.basis = basis;
            }
        });
        if let Err(e) = r {
            let field = match &e {
                SnapshotError::InvalidEnum { field, .. } | SnapshotError::Unspecified { field } => *field,
                other => panic!("{other}"),
            };
            prop_assert!(["GpuAttribution.sharing", "CostLines.basis"].contains(&field));
        }
    }
}
