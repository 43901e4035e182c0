//! The snapshot as a message: what `top --connect` renders from it is what a local `top` renders,
//! the attribution's lines add up on the message itself, prost round-trips it, and bad messages are
//! named errors.

use gpu_tracer_proto::prost::Message;
use proptest::prelude::*;

use super::{counters::DECODE_ERROR_REASONS, driver::DEVICE_KINDS, *};
use crate::fixtures::snapshot::*;
use crate::{
    attribution::gpu::FULL,
    config::AttachMode,
    decode::{DecodeError, DeviceKind},
    model::probes::{EntryReport, FamilyStatus, KernelFeatures, LibraryReport, ProbeMode, ProbeReport},
};

fn round_trip(s: &AgentSnapshot) -> AgentSnapshot {
    snapshot_from_proto(snapshot_to_proto(s, T0 + 2 * SEC)).expect("a message the agent made is valid")
}

#[test]
fn everything_the_message_carries_survives_a_second_round_trip() {
    let p = snapshot_to_proto(&rich(), T0);
    let again = snapshot_to_proto(&snapshot_from_proto(p.clone()).expect("valid"), T0);
    assert_eq!(again, p);
    assert_eq!(p.interval_ns, SEC);
    assert_eq!(p.taken_at_unix_ns, T0);
}

/// Each GPU's temperature is carried (`NvmlGpu.temperature_c`), and one NVML did not give stays
/// unknown.
#[test]
fn a_gpus_temperature_survives_the_round_trip() {
    let mut s = rich();
    let mut sample = s.nvml.sample.as_deref().expect("sampled").clone();
    sample.devices[0].temperature_c = Some(61);
    s.nvml.sample = Some(std::sync::Arc::new(sample));
    let p = snapshot_to_proto(&s, T0);
    let gpus = &p.nvml.as_ref().and_then(|n| n.sample.as_ref()).expect("sampled").gpus;
    assert_eq!(gpus.iter().map(|g| g.temperature_c).collect::<Vec<_>>(), [Some(61), None, None]);
    let back = snapshot_from_proto(p).expect("valid");
    let devices = &back.nvml.sample.as_deref().expect("sampled").devices;
    assert_eq!(devices.iter().map(|d| d.temperature_c).collect::<Vec<_>>(), [Some(61), None, None]);
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
    assert_eq!((back.state, back.cuda, back.kernel), (s.state, s.cuda, s.kernel));
    assert!(back.containers.is_empty() && back.violations.is_empty());
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
