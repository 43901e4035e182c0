//! Unit tests of the exposition; `sample_snapshot`, `parse` and `value` serve `export::http`'s tests too.
use std::{collections::HashMap, sync::Arc};

use openmetrics_parser::{MetricFamily, MetricsExposition, OpenMetricsType, OpenMetricsValue};

use super::*;
use tracer_core::{
    allocation::AllocationStatus,
    attribution::{
        AttributionInput, AttributionSnapshot, Attributor, ContainerInput, ContainerKey, GpuInput, ProcessInput,
        input::{EnergyInput, EnergySource},
    },
    config::{AttachMode, AttributionSettings},
    cuda::ledger::{CudaCgroupRow, CudaSnapshot, CudaUsage},
    guardrails::{GpuRef, Violation, ViolationCounts, ViolationKind},
    identity::{ContainerIdentity, KubeStatus},
    model::{
        Accounting, KubeView, KubernetesStatus, NvmlStatus, NvmlView, PipelineStats,
        counters::{KernelCounters, ProbeCounters},
        probes::ProbeMode,
    },
    nvml::model::{Clocks, DeviceSample, MemoryInfo, MigInstance, NvmlSample, Utilization},
    state::snapshot::{CgroupRow, GpuRow, Snapshot, Totals, Usage},
};

const POD_A: &str = "/kubepods.slice/kubepods-pod1.slice/cri-containerd-aaa.scope";
const POD_B: &str = "/kubepods.slice/kubepods-pod2.slice/cri-containerd-bbb.scope";

fn usage(vid: u64, sys: u64, managed: u64) -> Usage {
    Usage {
        vidmem_bytes: vid,
        sysmem_bytes: sys,
        managed_bytes: managed,
        live_allocations: 2,
        allocations: 5,
        frees: 3,
        ioctls: 40,
        failed_calls: 1,
        ..Default::default()
    }
}

/// A snapshot with two resolved cgroups, one with no path, two GPUs and the unknown bucket.
pub(crate) fn sample_snapshot() -> AgentSnapshot {
    let cg = |id, path: Option<&str>, processes, u| CgroupRow {
        cgroup_id: id,
        path: path.map(Into::into),
        processes,
        removed: false,
        usage: u,
        completeness: Default::default(),
    };
    let mut state = Snapshot {
        totals: Totals { usage: Usage::default(), processes: 3, cgroups: 3, live_allocations: 6, ..Default::default() },
        cgroups: vec![
            cg(11, Some(POD_A), 2, usage(3 << 30, 1 << 20, 0)),
            cg(12, Some(POD_B), 1, usage(1 << 30, 0, 64 << 20)),
            cg(13, None, 0, usage(4096, 0, 0)),
        ],
        processes: Vec::new(),
        gpus: vec![
            GpuRow { minor: Some(0), usage: usage(3 << 30, 0, 0), completeness: Default::default() },
            GpuRow { minor: Some(1), usage: usage((1 << 30) + 4096, 1 << 20, 0), completeness: Default::default() },
            GpuRow { minor: None, usage: usage(0, 0, 64 << 20), completeness: Default::default() },
        ],
        ..Default::default()
    };
    // POD_B's process ran before the agent and later lost records: its ledger rows say so.
    state.cgroups[1].completeness = tracer_core::state::Completeness {
        from_before_agent: 1,
        records_lost_since_unix_ns: Some(1_764_640_205_000_000_000),
        nvml_bytes_from_before_agent: Some(1_610_612_736),
    };
    state.counters.events.insert("ioctl", 9);
    state.counters.ioctls_by_op.insert("rm_alloc", 9);
    state.counters.failed_by_op.insert("rm_alloc", 1);
    state.counters.released_by.insert("process_exit", 2);
    state.counters.malformed_by_reason.insert("short_params", 1);
    state.counters.handle_table_full = 7;
    let cuda = CudaSnapshot {
        cgroups: vec![CudaCgroupRow {
            cgroup_id: 11,
            path: Some(POD_A.into()),
            usage: CudaUsage {
                device_bytes: 2 << 30,
                launches: 12345,
                graph_launches: 3,
                allocs: 4,
                ..Default::default()
            },
        }],
        calls_by_entry: [("cuLaunchKernel", 12345)].into_iter().collect(),
        ..Default::default()
    };
    let probe = |seen, emitted, rb| {
        let mut c = ProbeCounters { seen, emitted, ..Default::default() };
        c.set_dropped(tracer_common::counter::DROP_RINGBUF_FULL, rb);
        c
    };
    AgentSnapshot {
        state,
        cuda,
        ledger_check: Vec::new(),
        kernel: KernelCounters { probes: vec![("ioctl".into(), probe(100, 97, 3)), ("open".into(), probe(5, 5, 0))] },
        pipeline: PipelineStats {
            received: 102,
            decoded: 101,
            decode_errors: [("truncated", 1)].into_iter().collect(),
            ..Default::default()
        },
        accounting: Accounting { seen: 105, received: 102, aggregated: 0, dropped: 3, in_flight: 0, exact: true },
        attach_mode: ProbeMode::Attached(AttachMode::SyscallTracepoint),
        probe_families: sample_families(),
        driver_version: "570.86.15".into(),
        attribution: Some(Arc::new(sample_attribution())),
        containers: [(
            12,
            ContainerIdentity {
                cgroup_id: 12,
                cgroup_path: Some(POD_B.into()),
                kind: "container",
                namespace: Some("team-b".into()),
                pod: Some("serve-1".into()),
                container: Some("server".into()),
                labels: [("team".to_string(), "search".to_string()), ("app.kubernetes.io/name".into(), "serve".into())]
                    .into_iter()
                    .collect(),
                ..Default::default()
            },
        )]
        .into_iter()
        .collect(),
        violations: vec![
            violation(ViolationKind::UnallocatedGpuOpen, Some(GPU_A)),
            violation(ViolationKind::GpuUseWithoutAllocation, None),
        ],
        violation_counts: ViolationCounts {
            unallocated_gpu_open: 1,
            gpu_use_without_allocation: 1,
            unresolved: 2,
            ..Default::default()
        },
        nvml: NvmlView {
            status: NvmlStatus::Ready,
            failed_readings: [("not_supported", 3)].into_iter().collect(),
            samples: 7,
            sample: Some(Arc::new(sample_nvml())),
            ..Default::default()
        },
        kubernetes: KubeView {
            status: KubernetesStatus::Running,
            watcher: Some(KubeStatus { connected: true, ready: true, pods_cached: 4, ..Default::default() }),
            pod_resources: Some(AllocationStatus { available: true, refreshes: 5, ..Default::default() }),
            ..Default::default()
        },
        otlp: Some(tracer_core::model::OtlpStats {
            endpoint: "http://collector:4317".into(),
            protocol: "grpc",
            metric_points_exported: 120,
            log_records_exported: 7,
            log_queue_capacity: 8192,
            dropped: vec![tracer_core::model::OtlpDrop { signal: "logs", reason: "queue_full", count: 3 }],
            ..Default::default()
        }),
        api: Some(tracer_core::model::ApiStats {
            published: 900,
            subscribers: 2,
            subscriptions: 3,
            refused: 1,
            lost: 40,
            connections: tracer_core::model::ApiConnStats {
                refused_server_limit: 6,
                refused_peer_limit: 7,
                handshake_timeout: 8,
                handshake_failed: 9,
            },
        }),
        http: Some(tracer_core::model::HttpStats { refused_server_limit: 2, refused_peer_limit: 5, unauthorized: 3 }),
        ..Default::default()
    }
}

/// Driver attached, lifecycle switched off, cuda with no libcuda to probe: ready.
pub(crate) fn sample_families() -> Vec<tracer_core::model::ProbeFamilyState> {
    use tracer_core::model::{ProbeFamilyState, probes::FamilyStatus};
    vec![
        ProbeFamilyState { family: "driver", status: FamilyStatus::Attached { programs: vec!["tp/x".into()] } },
        ProbeFamilyState { family: "lifecycle", status: FamilyStatus::Disabled },
        ProbeFamilyState { family: "cuda", status: FamilyStatus::NothingToProbe { error: "no libcuda.so.1".into() } },
    ]
}

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const GPU_A: &str = "GPU-aaaaaaaa-1111-2222-3333-444444444444";
const GPU_PARENT: &str = "GPU-cccccccc-1111-2222-3333-444444444444";
const MIG_B: &str = "MIG-bbbbbbbb-1111-2222-3333-444444444444";

fn proc(pid: u32, container: Option<u64>, used: u64, sm: Option<f64>) -> ProcessInput {
    ProcessInput {
        pid,
        container: container.map(ContainerKey),
        nvml_used_bytes: Some(used),
        nvml_sm_pct: sm,
        ..Default::default()
    }
}

/// One interval of a real attribution: a time-sliced GPU (containers 11 and 12 and a host
/// process; 12 holds memory and runs nothing) and a MIG instance used by 11, priced.
fn sample_attribution() -> AttributionSnapshot {
    let whole = GpuInput {
        uuid: GPU_A.into(),
        index: Some(0),
        minor: Some(0),
        name: Some("NVIDIA H100 80GB HBM3".into()),
        share_of_gpu_ppm: 1_000_000,
        memory: Some(MemoryInfo { total: 80 * GIB, reserved: 512 * MIB, used: 31 * GIB, free: 49 * GIB - 512 * MIB }),
        sm_activity_pct: Some(60),
        energy: Some(EnergyInput { delta_mj: 100_000, source: EnergySource::Counter }),
        processes: vec![
            proc(101, Some(11), 20 * GIB, Some(50.0)),
            proc(102, Some(12), 10 * GIB, Some(0.0)),
            proc(200, None, GIB, Some(5.0)),
        ],
        launches: [(ContainerKey(11), 500)].into_iter().collect(),
        ..Default::default()
    };
    let mig = GpuInput {
        uuid: MIG_B.into(),
        parent_uuid: Some(GPU_PARENT.into()),
        index: Some(1),
        minor: Some(1),
        mig_profile: Some("3g.40gb".into()),
        share_of_gpu_ppm: 428_571,
        memory: Some(MemoryInfo { total: 40 * GIB, reserved: 0, used: 5 * GIB, free: 35 * GIB }),
        energy: Some(EnergyInput { delta_mj: 20_000, source: EnergySource::ParentShare }),
        processes: vec![proc(103, Some(11), 5 * GIB, None)],
        launches: [(ContainerKey(11), 100)].into_iter().collect(),
        ..Default::default()
    };
    let containers = [(11, "ml/trainer-0/main"), (12, "team-b/serve-1/server")]
        .into_iter()
        .map(|(k, n)| (ContainerKey(k), ContainerInput { name: Some(n.into()), request: None }))
        .collect();
    let input = AttributionInput {
        start_unix_ns: 1_700_000_000_000_000_000,
        interval_ns: 1_000_000_000,
        gpus: vec![whole, mig],
        containers,
    };
    let settings =
        AttributionSettings { price_per_gpu_hour: Some(3.6), idle_reservation_after_s: 0, ..Default::default() };
    Attributor::new(&settings).update(&input)
}

fn sample_nvml() -> NvmlSample {
    let gpu = DeviceSample {
        index: 0,
        uuid: GPU_A.into(),
        name: Some("NVIDIA H100 80GB HBM3".into()),
        minor: Some(0),
        memory: Some(MemoryInfo { total: 80 * GIB, reserved: 512 * MIB, used: 31 * GIB, free: 49 * GIB }),
        utilization: Some(Utilization { gpu_pct: 60, memory_pct: 25 }),
        power_mw: Some(250_500),
        energy_mj: Some(123_456_789),
        clocks: Clocks { sm_mhz: Some(1980), memory_mhz: Some(2619), ..Default::default() },
        temperature_c: Some(55),
        ..Default::default()
    };
    let parent = DeviceSample {
        index: 1,
        uuid: GPU_PARENT.into(),
        minor: Some(1),
        mig_enabled: Some(true),
        mig_instances: vec![MigInstance {
            uuid: MIG_B.into(),
            name: Some("NVIDIA H100 80GB HBM3 MIG 3g.40gb".into()),
            memory: Some(MemoryInfo { total: 40 * GIB, reserved: 0, used: 5 * GIB, free: 35 * GIB }),
            ..Default::default()
        }],
        ..Default::default()
    };
    NvmlSample { devices: vec![gpu, parent], ..Default::default() }
}

fn violation(kind: ViolationKind, gpu: Option<&str>) -> Violation {
    Violation {
        kind,
        namespace: "team-c".into(),
        pod: "sidecar-0".into(),
        container: "borrower".into(),
        pid: 300,
        gpu: gpu.map(|u| GpuRef { uuid: Some(u.into()), minor: Some(0), index: Some(0), mig_uuid: None }),
        evidence: Default::default(),
    }
}

/// Every series of a family as (labels, value).
fn samples(p: &Parsed, name: &str) -> Vec<(HashMap<String, String>, f64)> {
    family(p, name)
        .iter_samples()
        .map(|s| {
            let ls = s.get_labelset().expect("labelset");
            let labels = ls.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            let v = match &s.value {
                OpenMetricsValue::Gauge(n) | OpenMetricsValue::Unknown(n) => n.as_f64(),
                OpenMetricsValue::Counter(c) => c.value.as_f64(),
                other => panic!("unexpected value {other:?}"),
            };
            (labels, v)
        })
        .collect()
}

pub(crate) type Parsed = MetricsExposition<OpenMetricsType, OpenMetricsValue>;

/// Parse with a strict OpenMetrics parser (rejects duplicate series, missing `# EOF`, ...).
pub(crate) fn parse(text: &str) -> Parsed {
    openmetrics_parser::openmetrics::parse_openmetrics(text)
        .unwrap_or_else(|e| panic!("exposition does not parse: {e:?}\n{text}"))
}

fn family<'a>(p: &'a Parsed, name: &str) -> &'a MetricFamily<OpenMetricsType, OpenMetricsValue> {
    p.families.get(name).unwrap_or_else(|| panic!("no family {name}; have {:?}", p.families.keys()))
}

/// The value of the series of `family` with exactly these labels.
pub(crate) fn value(p: &Parsed, name: &str, labels: &[(&str, &str)]) -> f64 {
    let f = family(p, name);
    let want: HashMap<&str, &str> = labels.iter().copied().collect();
    let hits: Vec<f64> = f
        .iter_samples()
        .filter(|s| {
            let ls = s.get_labelset().expect("labelset");
            ls.iter().count() == want.len() && ls.iter().all(|(k, v)| want.get(k.as_str()) == Some(&v.as_str()))
        })
        .map(|s| match &s.value {
            OpenMetricsValue::Gauge(n) | OpenMetricsValue::Unknown(n) => n.as_f64(),
            OpenMetricsValue::Counter(c) => c.value.as_f64(),
            other => panic!("unexpected value {other:?}"),
        })
        .collect();
    assert_eq!(hits.len(), 1, "{name} {labels:?}: {} matching series", hits.len());
    hits[0]
}

fn container(cgroup: &str) -> [(&'static str, &str); 4] {
    [("namespace", ""), ("pod", ""), ("container", ""), ("cgroup", cgroup)]
}

#[test]
fn openmetrics_exposition_parses_with_names_labels_and_values() {
    let text = MetricsRegistry::new().encode(&Arc::new(sample_snapshot()), ExpositionFormat::OpenMetrics).unwrap();
    assert!(text.ends_with("# EOF\n"));
    let p = parse(&text);
    assert_eq!(family(&p, "gpu_tracer_cgroup_vidmem_bytes").family_type, OpenMetricsType::Gauge);
    assert_eq!(family(&p, "gpu_tracer_cgroup_vidmem_bytes").unit, "bytes");
    assert_eq!(value(&p, "gpu_tracer_cgroup_vidmem_bytes", &container(POD_A)), (3u64 << 30) as f64);
    assert_eq!(value(&p, "gpu_tracer_cgroup_sysmem_bytes", &container(POD_A)), (1u64 << 20) as f64);
    assert_eq!(value(&p, "gpu_tracer_http_unauthorized_requests", &[("endpoint", "/metrics")]), 3.0);
    // Cgroup 12 has a Kubernetes identity in the snapshot: its series carry it, and no cgroup path
    // (metrics.cgroup_label = "auto": a restarted container continues the same series)...
    let b = [("namespace", "team-b"), ("pod", "serve-1"), ("container", "server"), ("cgroup", "")];
    assert_eq!(value(&p, "gpu_tracer_cgroup_managed_bytes", &b), (64u64 << 20) as f64);
    // ... unless asked for ("always").
    let always = MetricsRegistry::new().with_cgroup_label(CgroupLabel::Always);
    let pa = parse(&always.encode(&Arc::new(sample_snapshot()), ExpositionFormat::OpenMetrics).unwrap());
    let b_path = [("namespace", "team-b"), ("pod", "serve-1"), ("container", "server"), ("cgroup", POD_B)];
    assert_eq!(value(&pa, "gpu_tracer_cgroup_managed_bytes", &b_path), (64u64 << 20) as f64);
    assert_eq!(value(&pa, "gpu_tracer_cgroup_vidmem_bytes", &container(POD_A)), (3u64 << 30) as f64);
    assert_eq!(value(&p, "gpu_tracer_cgroup_vidmem_bytes", &container("id:13")), 4096.0);
    assert_eq!(value(&p, "gpu_tracer_cgroup_processes", &container(POD_A)), 2.0);
    assert_eq!(value(&p, "gpu_tracer_processes", &[]), 3.0);
    // Counters: OpenMetrics family name without _total, type counter.
    assert_eq!(family(&p, "gpu_tracer_cgroup_cuda_launches").family_type, OpenMetricsType::Counter);
    assert_eq!(value(&p, "gpu_tracer_cgroup_cuda_launches", &container(POD_A)), 12345.0);
    assert_eq!(value(&p, "gpu_tracer_cgroup_cuda_device_bytes", &container(POD_A)), (2u64 << 30) as f64);
    assert_eq!(value(&p, "gpu_tracer_gpu_vidmem_bytes", &[("minor", "0"), ("device", "nvidia0")]), (3u64 << 30) as f64);
    assert_eq!(
        value(&p, "gpu_tracer_gpu_managed_bytes", &[("minor", "unknown"), ("device", "unknown")]),
        (64u64 << 20) as f64
    );
    assert_eq!(value(&p, "gpu_tracer_probe_events_seen", &[("probe", "ioctl")]), 100.0);
    assert_eq!(value(&p, "gpu_tracer_probe_events_dropped", &[("probe", "ioctl"), ("reason", "ringbuf_full")]), 3.0);
    assert_eq!(value(&p, "gpu_tracer_probe_events_dropped", &[("probe", "open"), ("reason", "no_entry")]), 0.0);
    assert_eq!(value(&p, "gpu_tracer_decode_errors", &[("reason", "truncated")]), 1.0);
    assert_eq!(value(&p, "gpu_tracer_records_received", &[]), 102.0);
    assert_eq!(value(&p, "gpu_tracer_accounting_exact", &[]), 1.0);
    assert_eq!(value(&p, "gpu_tracer_cuda_calls", &[("entry", "cuLaunchKernel")]), 12345.0);
    assert_eq!(value(&p, "gpu_tracer_state_anomalies", &[("kind", "handle_table_full")]), 7.0);
    assert_eq!(value(&p, "gpu_tracer_memory_releases", &[("cause", "process_exit")]), 2.0);
    assert_eq!(
        value(
            &p,
            "gpu_tracer_build_info",
            &[
                ("version", env!("CARGO_PKG_VERSION")),
                ("driver_version", "570.86.15"),
                ("abi_version", "570.86.15"),
                ("attach_mode", "syscall-tracepoint")
            ]
        ),
        1.0
    );
    // NVML's answer, when there is one, is the driver's version (the layouts may be another's).
    let mut with_nvml = sample_snapshot();
    with_nvml.nvml.driver_version = Some("575.51.03".into());
    let text = MetricsRegistry::new().encode(&Arc::new(with_nvml), ExpositionFormat::OpenMetrics).unwrap();
    let labels = [
        ("version", env!("CARGO_PKG_VERSION")),
        ("driver_version", "575.51.03"),
        ("abi_version", "570.86.15"),
        ("attach_mode", "syscall-tracepoint"),
    ];
    assert_eq!(value(&parse(&text), "gpu_tracer_build_info", &labels), 1.0);
    // Every cgroup and every GPU row is exposed, nothing else.
    assert_eq!(family(&p, "gpu_tracer_cgroup_vidmem_bytes").iter_samples().count(), 3);
    assert_eq!(family(&p, "gpu_tracer_gpu_vidmem_bytes").iter_samples().count(), 3);
}

/// The labels of a line of GPU `gpu` (`device`, `mig_profile`) and container `c`.
fn line<'a>(gpu: [&'a str; 3], line: &'a str, c: [(&'static str, &'a str); 4]) -> Vec<(&'static str, &'a str)> {
    let mut v = vec![("gpu", gpu[0]), ("device", gpu[1]), ("mig_profile", gpu[2]), ("line", line)];
    v.extend(c);
    v
}

#[test]
fn attribution_lines_add_up_and_carry_identity() {
    let text = MetricsRegistry::new().encode(&Arc::new(sample_snapshot()), ExpositionFormat::OpenMetrics).unwrap();
    let p = parse(&text);
    // Per GPU, the memory lines sum to the GPU's total, and the SM shares to 1.
    let totals = samples(&p, "gpu_tracer_attribution_memory_total_bytes");
    assert_eq!(totals.len(), 2);
    let memory = samples(&p, "gpu_tracer_attribution_memory_bytes");
    let sm = samples(&p, "gpu_tracer_attribution_sm_share_ratio");
    for (labels, total) in &totals {
        let gpu = &labels["gpu"];
        let lines: Vec<f64> = memory.iter().filter(|(l, _)| &l["gpu"] == gpu).map(|(_, v)| *v).collect();
        assert!(lines.len() >= 4, "{gpu}: {lines:?}");
        assert_eq!(lines.iter().sum::<f64>(), *total, "memory lines of {gpu}");
        let share: f64 = sm.iter().filter(|(l, _)| &l["gpu"] == gpu).map(|(_, v)| *v).sum();
        assert!((share - 1.0).abs() < 1e-9, "SM shares of {gpu} sum to {share}");
    }
    let a = [GPU_A, "nvidia0", ""];
    let mig = [MIG_B, "nvidia1", "3g.40gb"];
    assert_eq!(
        value(
            &p,
            "gpu_tracer_attribution_memory_total_bytes",
            &[("gpu", GPU_A), ("device", "nvidia0"), ("mig_profile", "")]
        ),
        (80 * GIB) as f64
    );
    // Container 12's lines carry namespace/pod/container from the snapshot's identity.
    let team_b = [("namespace", "team-b"), ("pod", "serve-1"), ("container", "server"), ("cgroup", "")];
    assert_eq!(value(&p, "gpu_tracer_attribution_memory_bytes", &line(a, "container", team_b)), (10 * GIB) as f64);
    assert_eq!(value(&p, "gpu_tracer_attribution_sm_share_ratio", &line(a, "container", team_b)), 0.0);
    assert_eq!(
        value(&p, "gpu_tracer_attribution_memory_bytes", &line(a, "driver_reserved", container(""))),
        (512 * MIB) as f64
    );
    assert_eq!(
        value(&p, "gpu_tracer_attribution_memory_bytes", &line(mig, "container", container(POD_A))),
        (5 * GIB) as f64
    );
    assert_eq!(value(&p, "gpu_tracer_attribution_interval_launches", &line(mig, "container", container(POD_A))), 100.0);
    assert_eq!(
        value(
            &p,
            "gpu_tracer_gpu_sharing_info",
            &[
                ("gpu", GPU_A),
                ("device", "nvidia0"),
                ("mig_profile", ""),
                ("mode", "time_slicing"),
                ("method", "process_samples")
            ]
        ),
        1.0
    );
    assert_eq!(
        value(
            &p,
            "gpu_tracer_gpu_sharing_info",
            &[
                ("gpu", MIG_B),
                ("device", "nvidia1"),
                ("mig_profile", "3g.40gb"),
                ("mode", "mig"),
                ("method", "launch_counts")
            ]
        ),
        1.0
    );
    // Energy lines add up to the GPU's delta; cost lines to the interval's price, and the bill
    // (one interval so far) to the same.
    let energy: f64 = samples(&p, "gpu_tracer_attribution_interval_energy_joules")
        .iter()
        .filter(|(l, _)| l["gpu"] == GPU_A)
        .map(|(_, v)| *v)
        .sum();
    assert!((energy - 100.0).abs() < 1e-9, "{energy}");
    let cost: f64 = samples(&p, "gpu_tracer_attribution_interval_cost").iter().map(|(_, v)| *v).sum();
    let bill: f64 = samples(&p, "gpu_tracer_bill").iter().map(|(_, v)| *v).sum();
    let price = 0.001 + 0.001 * 0.428_571;
    assert!((cost - price).abs() < 1e-9 && (bill - price).abs() < 1e-9, "cost {cost} bill {bill} price {price}");
    assert!(value(&p, "gpu_tracer_container_cost", &team_b) > 0.0);
    assert!(value(&p, "gpu_tracer_container_energy_joules", &container(POD_A)) > 0.0);
    assert_eq!(value(&p, "gpu_tracer_price_per_gpu_hour", &[]), 3.6);
    // Container 12 holds 10 GiB and ran nothing: flagged.
    assert_eq!(value(&p, "gpu_tracer_container_idle_reservation_bytes", &team_b), (10 * GIB) as f64);
    assert_eq!(family(&p, "gpu_tracer_container_idle_reservation_bytes").iter_samples().count(), 1);
    let rs = samples(&p, "gpu_tracer_container_rightsizing_info");
    assert!(
        rs.iter().any(|(l, v)| l["pod"] == "serve-1"
            && l["fit"] == "mig_profile"
            && !l["suggested"].is_empty()
            && *v == 1.0),
        "{rs:?}"
    );
}

#[test]
fn nvml_violations_and_kubernetes_series() {
    let p = parse(&MetricsRegistry::new().encode(&Arc::new(sample_snapshot()), ExpositionFormat::OpenMetrics).unwrap());
    let gpu = [("gpu", GPU_A), ("device", "nvidia0"), ("mig_profile", "")];
    assert_eq!(value(&p, "gpu_tracer_nvml_up", &[]), 1.0);
    assert_eq!(value(&p, "gpu_tracer_nvml_failed_readings", &[("reason", "not_supported")]), 3.0);
    assert_eq!(value(&p, "gpu_tracer_gpu_power_watts", &gpu), 250.5);
    assert_eq!(value(&p, "gpu_tracer_gpu_energy_joules", &gpu), 123_456.789);
    assert_eq!(value(&p, "gpu_tracer_gpu_temperature_celsius", &gpu), 55.0);
    assert_eq!(value(&p, "gpu_tracer_gpu_utilization_ratio", &gpu), 0.6);
    assert_eq!(value(&p, "gpu_tracer_gpu_sm_clock_hertz", &gpu), 1.98e9);
    assert_eq!(value(&p, "gpu_tracer_gpu_memory_used_bytes", &gpu), (31 * GIB - 512 * MIB) as f64);
    let mig = [("gpu", MIG_B), ("device", "nvidia1"), ("mig_profile", "3g.40gb")];
    assert_eq!(value(&p, "gpu_tracer_gpu_memory_total_bytes", &mig), (40 * GIB) as f64);
    // The parent of the MIG instance reported no power: no series rather than 0.
    assert_eq!(family(&p, "gpu_tracer_gpu_power_watts").iter_samples().count(), 1);
    // Every kind, also at 0.
    for (kind, n) in [
        ("unallocated_gpu_open", 1.0),
        ("unallocated_gpu_in_nvml", 0.0),
        ("gpu_use_without_allocation", 1.0),
        ("visible_devices_all_without_request", 0.0),
    ] {
        assert_eq!(value(&p, "gpu_tracer_violations", &[("kind", kind)]), n, "{kind}");
    }
    assert_eq!(value(&p, "gpu_tracer_violations_unresolved", &[]), 2.0);
    let who = [("namespace", "team-c"), ("pod", "sidecar-0"), ("container", "borrower")];
    let mut l = vec![("kind", "unallocated_gpu_open")];
    l.extend(who);
    l.push(("gpu", GPU_A));
    assert_eq!(value(&p, "gpu_tracer_violation_info", &l), 1.0);
    assert_eq!(value(&p, "gpu_tracer_kubernetes_up", &[]), 1.0);
    assert_eq!(value(&p, "gpu_tracer_pod_resources_up", &[]), 1.0);
    // With NVML and Kubernetes off: up is 0, the rest is left out.
    let mut snap = sample_snapshot();
    snap.nvml = NvmlView { status: NvmlStatus::Off, ..Default::default() };
    snap.kubernetes = KubeView::default();
    snap.attribution = None;
    let p = parse(&MetricsRegistry::new().encode(&Arc::new(snap), ExpositionFormat::OpenMetrics).unwrap());
    assert_eq!(value(&p, "gpu_tracer_nvml_up", &[]), 0.0);
    assert_eq!(value(&p, "gpu_tracer_kubernetes_up", &[]), 0.0);
    assert!(!p.families.contains_key("gpu_tracer_gpu_power_watts"));
    assert!(!p.families.contains_key("gpu_tracer_attribution_memory_bytes"));
    assert!(!p.families.contains_key("gpu_tracer_bill"));
}

#[test]
fn every_family_is_prefixed_and_documented() {
    let text = MetricsRegistry::new().encode(&Arc::new(sample_snapshot()), ExpositionFormat::OpenMetrics).unwrap();
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/metrics.md")).unwrap();
    let p = parse(&text);
    for (name, f) in &p.families {
        assert!(name.starts_with("gpu_tracer_"), "{name}");
        assert!(!f.help.is_empty(), "{name} has no help");
        // docs/metrics.md names each metric as it appears in a query (counters with _total).
        let sample_name =
            if f.family_type == OpenMetricsType::Counter { format!("{name}_total") } else { name.clone() };
        assert!(doc.contains(&format!("`{sample_name}`")), "docs/metrics.md does not list `{sample_name}`");
    }
    // And the other way: every metric in a table of the page is exposed.
    let documented: Vec<&str> =
        doc.lines().filter_map(|l| l.strip_prefix("| `gpu_tracer_")?.split('`').next()).collect();
    assert!(documented.len() > 40, "{documented:?}");
    for d in documented {
        let exposed = p.families.contains_key(&format!("gpu_tracer_{d}"))
            || d.strip_suffix("_total").is_some_and(|f| p.families.contains_key(&format!("gpu_tracer_{f}")));
        assert!(exposed, "docs/metrics.md lists gpu_tracer_{d}, which the exposition does not have");
    }
}

/// Issues 13 items 4 and 8: the ledger rows say whether they may be short.
#[test]
fn ledger_exactness_is_exposed_per_cgroup_and_gpu() {
    let text = MetricsRegistry::new().encode(&Arc::new(sample_snapshot()), ExpositionFormat::Prometheus).unwrap();
    let lines =
        |prefix: &str| -> Vec<String> { text.lines().filter(|l| l.starts_with(prefix)).map(str::to_owned).collect() };
    let exact = lines("gpu_tracer_cgroup_ledger_exact{");
    assert_eq!(exact.len(), 3, "{text}");
    assert_eq!(exact.iter().filter(|l| l.ends_with(" 0")).count(), 1, "{exact:?}");
    let since = lines("gpu_tracer_cgroup_ledger_records_lost_since_seconds{");
    assert_eq!(since.len(), 1, "only the cgroup that lost records: {since:?}");
    assert!(since[0].ends_with(" 1764640205"), "{since:?}");
    let before = lines("gpu_tracer_cgroup_processes_from_before_agent{");
    assert_eq!(before.iter().filter(|l| l.ends_with(" 1")).count(), 1, "{before:?}");
    let nvml = lines("gpu_tracer_cgroup_memory_from_before_agent_bytes{");
    assert_eq!(nvml.len(), 1, "only the cgroup with processes from before the agent: {nvml:?}");
    assert!(nvml[0].ends_with(" 1610612736"), "{nvml:?}");
    assert_eq!(lines("gpu_tracer_gpu_ledger_exact{").len(), 3, "{text}");
}

/// Issue 13 item 6: each family's state. `up` is 1 attached, 0 failed or nothing to probe, and
/// absent for a family switched off (so `== 0` alerts only on what was meant to run).
#[test]
fn probe_family_up_and_info_say_each_familys_state() {
    use tracer_core::model::probes::FamilyStatus;
    let mut snap = sample_snapshot();
    let text = MetricsRegistry::new().encode(&Arc::new(snap.clone()), ExpositionFormat::OpenMetrics).unwrap();
    let p = parse(&text);
    assert_eq!(value(&p, "gpu_tracer_probe_family_up", &[("family", "driver")]), 1.0);
    assert_eq!(value(&p, "gpu_tracer_probe_family_up", &[("family", "cuda")]), 0.0);
    assert_eq!(samples(&p, "gpu_tracer_probe_family_up").len(), 2, "no series for the family switched off");
    assert_eq!(value(&p, "gpu_tracer_probe_family_info", &[("family", "lifecycle"), ("state", "disabled")]), 1.0);
    assert_eq!(value(&p, "gpu_tracer_probe_family_info", &[("family", "cuda"), ("state", "nothing_to_probe")]), 1.0);
    snap.probe_families[0].status =
        FamilyStatus::Failed { error: "attach mode driver-entry is not implemented".into() };
    let text = MetricsRegistry::new().encode(&Arc::new(snap), ExpositionFormat::Prometheus).unwrap();
    assert!(text.contains("gpu_tracer_probe_family_up{family=\"driver\"} 0\n"), "{text}");
    assert!(text.contains("gpu_tracer_probe_family_info{family=\"driver\",state=\"failed\"} 1\n"), "{text}");
    assert!(!text.contains("driver-entry"), "free text stays out of the labels");
}

#[test]
fn classic_text_format_parses_too() {
    let text = MetricsRegistry::new().encode(&Arc::new(sample_snapshot()), ExpositionFormat::Prometheus).unwrap();
    assert!(!text.contains("# EOF"));
    let p = openmetrics_parser::prometheus::parse_prometheus(&text).expect("classic exposition parses");
    let f = p.families.get("gpu_tracer_cgroup_cuda_launches_total").expect("counter family with _total");
    assert_eq!(f.iter_samples().count(), 1);
}

#[test]
fn resolver_labels_and_rows_with_the_same_labels_are_summed() {
    // A resolver that knows pod A and maps the path-less cgroup onto the same container.
    let reg = MetricsRegistry::new().with_resolver(|id: u64, path: Option<&str>| {
        if id == 11 || id == 13 {
            ContainerLabels {
                namespace: "ml".into(),
                pod: "trainer-0".into(),
                container: "main".into(),
                cgroup: POD_A.into(),
            }
        } else {
            ContainerLabels::for_cgroup(id, path)
        }
    });
    let p = parse(&reg.encode(&Arc::new(sample_snapshot()), ExpositionFormat::OpenMetrics).unwrap());
    let a = [("namespace", "ml"), ("pod", "trainer-0"), ("container", "main"), ("cgroup", "")];
    assert_eq!(value(&p, "gpu_tracer_cgroup_vidmem_bytes", &a), ((3u64 << 30) + 4096) as f64);
    assert_eq!(value(&p, "gpu_tracer_cgroup_allocations", &a), 10.0);
    assert_eq!(family(&p, "gpu_tracer_cgroup_vidmem_bytes").iter_samples().count(), 2);
}

#[test]
fn an_added_source_is_encoded_after_the_builtins() {
    let reg = MetricsRegistry::new().with_source(|s: &Scrape<'_>, e: &mut dyn MetricEncoder| {
        gauge(
            e,
            "test_extra",
            "An extension source.",
            Some(Unit::Joules),
            s.snapshot.state.totals.processes as u64 * 10,
        )
    });
    let p = parse(&reg.encode(&Arc::new(sample_snapshot()), ExpositionFormat::OpenMetrics).unwrap());
    assert_eq!(value(&p, "gpu_tracer_test_extra_joules", &[]), 30.0);
    assert!(p.families.contains_key("gpu_tracer_cgroup_vidmem_bytes"));
}

#[test]
fn hostile_cgroup_paths_are_escaped() {
    let mut snap = sample_snapshot();
    snap.state.cgroups[0].path = Some("/a\"} evil{x=\"1\\\nnext".into());
    let p = parse(&MetricsRegistry::new().encode(&Arc::new(snap), ExpositionFormat::OpenMetrics).unwrap());
    assert_eq!(
        value(&p, "gpu_tracer_cgroup_vidmem_bytes", &container("/a\"} evil{x=\"1\\\nnext")),
        (3u64 << 30) as f64
    );
}

#[test]
fn an_empty_snapshot_still_parses() {
    let mut snap = sample_snapshot();
    snap.state = Snapshot::default();
    snap.cuda = CudaSnapshot::default();
    snap.kernel = KernelCounters::default();
    let p = parse(&MetricsRegistry::new().encode(&Arc::new(snap), ExpositionFormat::OpenMetrics).unwrap());
    assert!(!p.families.contains_key("gpu_tracer_cgroup_vidmem_bytes"));
    assert_eq!(value(&p, "gpu_tracer_processes", &[]), 0.0);
}

#[test]
fn negotiation_prefers_openmetrics_when_asked() {
    let prom = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
    assert_eq!(ExpositionFormat::negotiate(Some(prom)), ExpositionFormat::OpenMetrics);
    assert_eq!(ExpositionFormat::negotiate(Some("*/*")), ExpositionFormat::Prometheus);
    assert_eq!(ExpositionFormat::negotiate(None), ExpositionFormat::Prometheus);
}

/// The agent's /metrics also has its own `process_*` families, unprefixed (client_golang's names),
/// beside the prefixed ones; other uses of the registry do not.
#[test]
fn the_agent_exposes_its_process_metrics_unprefixed() {
    let snap = Arc::new(sample_snapshot());
    let text = MetricsRegistry::new().with_process_metrics().encode(&snap, ExpositionFormat::OpenMetrics).unwrap();
    let p = parse(&text);
    for name in [
        "process_cpu_seconds",
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
        "process_threads",
    ] {
        assert!(p.families.contains_key(name), "{name} missing: {:?}", p.families.keys().collect::<Vec<_>>());
    }
    assert!(value(&p, "process_resident_memory_bytes", &[]) > 0.0);
    assert!(p.families.contains_key("gpu_tracer_build_info"), "the prefixed families are still there");
    let plain = MetricsRegistry::new().encode(&snap, ExpositionFormat::Prometheus).unwrap();
    assert!(!plain.contains("\nprocess_") && !plain.contains("# HELP process_"), "none without with_process_metrics");
    // The classic text format too (what curl gets).
    let classic = MetricsRegistry::new().with_process_metrics().encode(&snap, ExpositionFormat::Prometheus).unwrap();
    assert!(classic.contains("\nprocess_cpu_seconds_total "), "{}", &classic[..400.min(classic.len())]);
}

#[test]
fn pod_labels_carry_the_allow_listed_labels_as_kube_state_metrics_names_them() {
    let p = parse(&MetricsRegistry::new().encode(&Arc::new(sample_snapshot()), ExpositionFormat::OpenMetrics).unwrap());
    let labels = [
        ("namespace", "team-b"),
        ("pod", "serve-1"),
        ("label_app_kubernetes_io_name", "serve"),
        ("label_team", "search"),
    ];
    assert_eq!(value(&p, "gpu_tracer_pod_labels", &labels), 1.0);
    // Only pods: the other cgroups have no pod.
    assert_eq!(family(&p, "gpu_tracer_pod_labels").iter_samples().count(), 1);
}

#[test]
fn every_decode_error_reason_is_exported_also_at_zero() {
    let mut snap = sample_snapshot();
    snap.pipeline.decode_errors.clear();
    snap.pipeline.decode_errors.insert("unknown_kind", 2);
    let p = parse(&MetricsRegistry::new().encode(&Arc::new(snap), ExpositionFormat::OpenMetrics).unwrap());
    for r in tracer_core::decode::DecodeError::REASONS {
        let want = if r == "unknown_kind" { 2.0 } else { 0.0 };
        assert_eq!(value(&p, "gpu_tracer_decode_errors", &[("reason", r)]), want, "{r}");
    }
}

#[test]
fn the_reason_list_names_every_decode_error() {
    use tracer_core::decode::DecodeError as E;
    let all = [
        E::Short { kind: 1, need: 2, got: 1 },
        E::UnknownKind { kind: 9 },
        E::BadRecordSize { kind: 1, declared: 1, expected: 2 },
        E::BadLength { field: "f", len: 9, max: 1 },
    ];
    let reasons: Vec<&str> = all.iter().map(E::reason).collect();
    assert_eq!(reasons, E::REASONS);
}

#[test]
fn nvml_only_mode_leaves_out_the_families_of_the_probes() {
    let mut snap = sample_snapshot();
    snap.attach_mode = ProbeMode::NvmlOnly;
    let text = MetricsRegistry::new().encode(&Arc::new(snap), ExpositionFormat::OpenMetrics).unwrap();
    for gone in [
        "gpu_tracer_probe_events_seen",
        "gpu_tracer_records_received",
        "gpu_tracer_accounting_exact",
        "gpu_tracer_decode_errors",
        "gpu_tracer_records_decoded",
        "gpu_tracer_cgroup_vidmem_bytes",
        "gpu_tracer_gpu_vidmem_bytes",
        "gpu_tracer_processes",
        "gpu_tracer_cgroup_cuda_launches",
        "gpu_tracer_cuda_calls",
        "gpu_tracer_ioctls",
    ] {
        assert!(!text.contains(&format!("# TYPE {gone} ")), "{gone} is exported in nvml-only mode");
    }
    // What NVML and the attribution give stays.
    for kept in ["gpu_tracer_build_info", "gpu_tracer_attribution_memory_bytes", "gpu_tracer_nvml_up"] {
        assert!(text.contains(&format!("# TYPE {kept} ")), "{kept} is missing in nvml-only mode");
    }
}
