use super::*;
use crate::{
    attribution::{
        AttributionInput, Attributor, ContainerInput, GpuInput, ProcessInput,
        input::{ContainerKey, EnergyInput, EnergySource},
    },
    config::AttributionSettings,
    nvml::model::MemoryInfo,
};

const GIB: u64 = 1 << 30;
const GPU: &str = "GPU-aaaaaaaa-1111-2222-3333-444444444444";
const SEC: u64 = 1_000_000_000;
/// The attribution interval ends here (wall clock).
const T0: u64 = 1_700_000_001_000_000_000;

/// One 80 GiB GPU: ml/train-a holds 61 GiB, serving/infer-b 14 GiB, 0.5 GiB reserved.
fn attribution() -> Arc<AttributionSnapshot> {
    let mut containers = std::collections::BTreeMap::new();
    let mut processes = Vec::new();
    for (id, name, bytes) in [(11u64, "ml/train-a/main", 61 * GIB), (12, "serving/infer-b/server", 14 * GIB)] {
        containers.insert(ContainerKey(id), ContainerInput { name: Some(name.into()), request: None });
        processes.push(ProcessInput {
            pid: id as u32,
            container: Some(ContainerKey(id)),
            nvml_used_bytes: Some(bytes),
            ..Default::default()
        });
    }
    let used = 75 * GIB;
    let gpu = GpuInput {
        uuid: GPU.into(),
        index: Some(0),
        name: Some("NVIDIA H100 80GB HBM3".into()),
        share_of_gpu_ppm: 1_000_000,
        memory: Some(MemoryInfo { total: 80 * GIB, reserved: GIB / 2, used, free: 80 * GIB - used - GIB / 2 }),
        sm_activity_pct: Some(50),
        energy: Some(EnergyInput { delta_mj: 1000, source: EnergySource::Counter }),
        processes,
        ..Default::default()
    };
    let mut a = Attributor::new(&AttributionSettings::default());
    Arc::new(a.update(&AttributionInput { start_unix_ns: T0 - SEC, interval_ns: SEC, gpus: vec![gpu], containers }))
}

fn cuda(ktime: u64, tgid: u32, cgroup: u64, bytes: u64) -> FailedAlloc {
    FailedAlloc {
        ktime_ns: ktime,
        unix_ns: T0 + ktime,
        tgid,
        tid: tgid,
        cgroup_id: cgroup,
        gpu: None,
        bytes,
        source: OomSource::Cuda { entry_point: "cuMemAlloc_v2".into(), result: CUDA_ERROR_OUT_OF_MEMORY },
    }
}

fn driver(ktime: u64, tgid: u32, cgroup: u64, bytes: u64) -> FailedAlloc {
    FailedAlloc {
        gpu: Some(GPU.into()),
        source: OomSource::Driver { status: tracer_common::nv::NV_ERR_NO_MEMORY },
        ..cuda(ktime, tgid, cgroup, bytes)
    }
}

#[test]
fn which_failures_are_out_of_memory() {
    use tracer_common::cuda_entry as e;
    assert!(driver_oom(0x51) && !driver_oom(0) && !driver_oom(0x1f));
    for entry in [
        e::MEM_ALLOC,
        e::MEM_ALLOC_ASYNC,
        e::MEM_ALLOC_ASYNC_PTSZ,
        e::MEM_ALLOC_PITCH,
        e::MEM_CREATE,
        e::MEM_ALLOC_MANAGED,
    ] {
        assert!(cuda_oom(entry, CUDA_ERROR_OUT_OF_MEMORY), "{entry}");
        assert!(!cuda_oom(entry, 1), "{entry}: CUDA_ERROR_INVALID_VALUE is not out of memory");
    }
    assert!(!cuda_oom(e::MEM_ALLOC_HOST, CUDA_ERROR_OUT_OF_MEMORY), "pinned host memory is not GPU memory");
    assert!(!cuda_oom(e::MEM_FREE, CUDA_ERROR_OUT_OF_MEMORY));
}

/// A retry loop that fails 10,000 times in a second is one event with the count, naming the
/// largest holder with its exact bytes; the GPU comes from the driver's failure, the split from
/// the attribution at the first failure, with its age.
#[test]
fn a_retry_storm_is_one_event_with_the_count_and_the_split() {
    let a = attribution();
    let mut d = OomDetector::new(OomSettings::default());
    for i in 0..5000u64 {
        // libcuda's failed call (no GPU known) and the RM allocation under it.
        d.failure(cuda(i * 200_000, 42, 12, 2 * GIB), Some(&a));
        d.failure(driver(i * 200_000 + 1, 42, 12, 2 * GIB + i), Some(&a));
    }
    assert!(d.poll(SEC).is_empty(), "still failing within the quiet time: open");
    let events = d.poll(5000 * 200_000 + SEC);
    assert_eq!(events.len(), 1, "{events:#?}");
    let e = &events[0];
    assert_eq!((e.count, e.tgid, e.cgroup_id, e.bytes), (10_000, 42, 12, 2 * GIB));
    assert_eq!(e.max_bytes, 2 * GIB + 4999);
    assert_eq!(e.gpu.as_deref(), Some(GPU));
    assert!(matches!(e.source, OomSource::Cuda { .. }), "the first failure's call");
    let s = e.split.as_ref().expect("the split at the first failure");
    assert_eq!(s.holders[0], Holder { cgroup_id: 11, name: Some("ml/train-a/main".into()), bytes: 61 * GIB });
    assert_eq!(s.holders[1].bytes, 14 * GIB);
    assert_eq!(
        s.holders.iter().map(|h| h.bytes).sum::<u64>() + s.driver_reserved + s.unattributed + s.free,
        s.total,
        "the split adds up to the GPU: {s:#?}"
    );
    assert_eq!(s.total, 80 * GIB);
    assert_eq!(s.age_ns, 0, "the first failure came at the interval's end");
    assert_eq!(d.counts(), (10_000, 1));
}

/// Two processes fail at once: two events. A burst that never goes quiet is reported every
/// `max_burst_ns`, the next failures starting a new one.
#[test]
fn bursts_are_per_process_and_bounded_in_time_and_number() {
    let a = attribution();
    let mut d = OomDetector::new(OomSettings { quiet_ns: SEC, max_burst_ns: 3 * SEC, max_open: 2 });
    d.failure(driver(0, 1, 11, GIB), Some(&a));
    d.failure(driver(10, 2, 12, GIB), Some(&a));
    // A third process while two bursts are open: counted, not kept.
    d.failure(driver(20, 3, 13, GIB), Some(&a));
    assert_eq!(d.dropped(), 1);
    for t in 1..40u64 {
        d.failure(driver(t * SEC / 10, 1, 11, GIB), Some(&a));
    }
    // The burst of process 1 closed at 3 s (the longest burst), the next failures began another.
    let first = d.poll(3 * SEC);
    assert_eq!(first.iter().map(|e| (e.tgid, e.count)).collect::<Vec<_>>(), [(1, 30), (2, 1)]);
    let next = d.poll(5 * SEC);
    assert_eq!(next.iter().map(|e| (e.tgid, e.count)).collect::<Vec<_>>(), [(1, 10)]);
    // Without an attribution interval (no NVML) the split is `None`, said as such.
    d.failure(driver(10 * SEC, 1, 11, GIB), None);
    let last = d.poll(12 * SEC);
    assert_eq!((last.len(), last[0].count, last[0].split.is_none()), (1, 1, true));
    assert_eq!(d.counts(), (43, 4));
}
