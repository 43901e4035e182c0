use super::*;
use crate::allocation::Allocator;

const GPU_A: &str = "GPU-aaaaaaaa-0000-0000-0000-000000000000";
const GPU_B: &str = "GPU-bbbbbbbb-0000-0000-0000-000000000000";
const MIG_A0: &str = "MIG-a0a0a0a0-0000-0000-0000-000000000000";
const MIG_A1: &str = "MIG-a1a1a1a1-0000-0000-0000-000000000000";

/// Two GPUs: index 0 = GPU-A at /dev/nvidia0 with two MIG devices, index 1 = GPU-B at /dev/nvidia1.
fn map() -> GpuMap {
    GpuMap {
        gpus: vec![
            PhysicalGpu {
                index: 0,
                uuid: GPU_A.into(),
                minor: Some(0),
                migs: vec![
                    MigDevice { index: 0, uuid: MIG_A0.into(), gpu_instance_id: Some(7), compute_instance_id: Some(0) },
                    MigDevice { index: 1, uuid: MIG_A1.into(), gpu_instance_id: Some(8), compute_instance_id: Some(0) },
                ],
            },
            PhysicalGpu { index: 1, uuid: GPU_B.into(), minor: Some(1), migs: vec![] },
        ],
    }
}

fn ctr(name: &str) -> ContainerRef {
    ContainerRef::new("ml", format!("{name}-pod"), name)
}

/// Allocations from (container, device-plugin ids).
fn allocations(entries: &[(&str, &[&str])]) -> GpuAllocations {
    let mut a = GpuAllocations::default();
    for (c, ids) in entries {
        let gpus = ids
            .iter()
            .map(|id| {
                let (device, replica) = crate::allocation::parse_device_id(id).unwrap();
                AllocatedGpu {
                    raw_id: id.to_string(),
                    via: Allocator::DevicePlugin { resource: "nvidia.com/gpu".into() },
                    device,
                    replica,
                }
            })
            .collect();
        a.by_container.insert(ctr(c), gpus);
    }
    a
}

fn gpu_dev(minor: u32) -> Device {
    Device { kind: DeviceKind::Gpu, minor, file_id: 100 + minor as u64 }
}

fn proc_in(c: Option<&str>, minors: &[u32], nvml: &[&str]) -> GpuProcessObservation {
    let mut opened = vec![
        // Every CUDA process holds these; they are not GPUs.
        Device { kind: DeviceKind::Ctl, minor: 0, file_id: 1 },
        Device { kind: DeviceKind::Uvm, minor: 0, file_id: 2 },
        Device { kind: DeviceKind::Caps, minor: 3, file_id: 3 },
    ];
    opened.extend(minors.iter().map(|&m| gpu_dev(m)));
    GpuProcessObservation {
        pid: 4242,
        container: c.map(ctr),
        opened,
        nvml_uuids: nvml.iter().map(|s| s.to_string()).collect(),
        visible_devices: VisibleDevices::default(),
    }
}

fn run(allocs: &GpuAllocations, procs: &[GpuProcessObservation]) -> Vec<Violation> {
    Guardrails::new("/dev").evaluate(procs, &map(), allocs)
}

/// (kind, GPU or MIG UUID) of each violation.
type Kinds = Vec<(ViolationKind, Option<String>)>;

fn kinds(v: &[Violation]) -> Kinds {
    v.iter().map(|v| (v.kind, v.gpu.as_ref().and_then(|g| g.uuid.clone().or(g.mig_uuid.clone())))).collect()
}

#[test]
fn allocated_gpu_a_opening_gpu_b_is_one_violation_with_evidence() {
    let allocs = allocations(&[("train", &[GPU_A])]);
    let mut p = proc_in(Some("train"), &[0, 1], &[]);
    p.visible_devices = VisibleDevices { nvidia: Some(GPU_A.into()), cuda: Some("0".into()) };
    let v = run(&allocs, &[p]);
    assert_eq!(v.len(), 1, "{v:#?}");
    let v = &v[0];
    assert_eq!(v.kind, ViolationKind::UnallocatedGpuOpen);
    assert_eq!((v.namespace.as_str(), v.pod.as_str(), v.container.as_str()), ("ml", "train-pod", "train"));
    assert_eq!(v.pid, 4242);
    assert_eq!(v.gpu, Some(GpuRef { uuid: Some(GPU_B.into()), minor: Some(1), index: Some(1), mig_uuid: None }));
    assert_eq!(v.evidence.device_path.as_deref(), Some(Path::new("/dev/nvidia1")));
    assert_eq!(v.evidence.nvml_uuid, None);
    assert_eq!(v.evidence.visible_devices.nvidia.as_deref(), Some(GPU_A));
    assert_eq!(v.evidence.visible_devices.cuda.as_deref(), Some("0"));
    assert_eq!(v.evidence.allocated, vec![GPU_A.to_string()]);
}

#[test]
fn each_kind_by_example() {
    use ViolationKind::*;
    let allocs = allocations(&[("train", &[GPU_A])]);
    let table: Vec<(&str, GpuProcessObservation, Kinds)> = vec![
        ("own GPU: opened and in NVML", proc_in(Some("train"), &[0], &[GPU_A]), vec![]),
        ("opens another GPU", proc_in(Some("train"), &[1], &[]), vec![(UnallocatedGpuOpen, Some(GPU_B.into()))]),
        (
            "NVML sees it on another GPU",
            proc_in(Some("train"), &[], &[GPU_B]),
            vec![(UnallocatedGpuInNvml, Some(GPU_B.into()))],
        ),
        (
            "no allocation, opens a GPU",
            proc_in(Some("sidecar"), &[1], &[]),
            vec![(GpuUseWithoutAllocation, Some(GPU_B.into()))],
        ),
        (
            "no allocation, open and NVML of the same GPU are one violation",
            proc_in(Some("sidecar"), &[0], &[GPU_A]),
            vec![(GpuUseWithoutAllocation, Some(GPU_A.into()))],
        ),
        ("no allocation, only ctl/uvm/caps open", proc_in(Some("sidecar"), &[], &[]), vec![]),
        ("host process", proc_in(None, &[0, 1], &[GPU_A, GPU_B]), vec![]),
        (
            "NVIDIA_VISIBLE_DEVICES=all without a request",
            GpuProcessObservation {
                visible_devices: VisibleDevices { nvidia: Some("all".into()), cuda: None },
                ..proc_in(Some("sidecar"), &[], &[])
            },
            vec![(VisibleDevicesAllWithoutRequest, None)],
        ),
        (
            "NVIDIA_VISIBLE_DEVICES=all with a request is not its own kind",
            GpuProcessObservation {
                visible_devices: VisibleDevices { nvidia: Some("all".into()), cuda: None },
                ..proc_in(Some("train"), &[0], &[])
            },
            vec![],
        ),
    ];
    for (what, p, want) in table {
        assert_eq!(kinds(&run(&allocs, &[p])), want, "{what}");
    }
}

#[test]
fn all_without_request_plus_use_is_two_violations() {
    let p = GpuProcessObservation {
        visible_devices: VisibleDevices { nvidia: Some(" all ".into()), cuda: Some("0,1".into()) },
        ..proc_in(Some("sidecar"), &[1], &[])
    };
    let v = run(&GpuAllocations::default(), &[p]);
    let mut k: Vec<_> = v.iter().map(|v| v.kind).collect();
    k.sort();
    assert_eq!(k, vec![ViolationKind::GpuUseWithoutAllocation, ViolationKind::VisibleDevicesAllWithoutRequest]);
    let all = v.iter().find(|v| v.kind == ViolationKind::VisibleDevicesAllWithoutRequest).unwrap();
    assert_eq!(all.gpu, None);
    assert_eq!(all.evidence.visible_devices.nvidia.as_deref(), Some(" all "));
    assert!(all.evidence.allocated.is_empty());
}

#[test]
fn deduplicated_for_the_containers_lifetime() {
    let allocs = allocations(&[("train", &[GPU_A])]);
    let mut g = Guardrails::new("/dev");
    let p = proc_in(Some("train"), &[1], &[GPU_B]);
    let first = g.evaluate(std::slice::from_ref(&p), &map(), &allocs);
    assert_eq!(first.len(), 2, "an open and an NVML sighting are different kinds: {first:#?}");
    // Same evidence again, from the same and from another process of the container: nothing new.
    assert!(g.evaluate(std::slice::from_ref(&p), &map(), &allocs).is_empty());
    let other = GpuProcessObservation { pid: 7, ..p.clone() };
    assert!(g.evaluate(&[other, p.clone()], &map(), &allocs).is_empty());
    let c = g.counts();
    assert_eq!((c.unallocated_gpu_open, c.unallocated_gpu_in_nvml, c.gpu_use_without_allocation), (1, 1, 0));
    assert_eq!(c.get(ViolationKind::UnallocatedGpuOpen), 1);
    // Another container doing the same is its own violation.
    let neighbour = proc_in(Some("train2"), &[1], &[]);
    let allocs2 = allocations(&[("train", &[GPU_A]), ("train2", &[GPU_A])]);
    assert_eq!(g.evaluate(&[neighbour], &map(), &allocs2).len(), 1);
    // The container goes and comes back: judged anew.
    g.forget_container(&ctr("train"));
    assert_eq!(g.evaluate(std::slice::from_ref(&p), &map(), &allocs).len(), 2);
    g.retain_containers(|c| c.container != "train2");
    assert_eq!(g.evaluate(&[proc_in(Some("train2"), &[1], &[])], &map(), &allocs2).len(), 1);
    assert_eq!(g.counts().unallocated_gpu_open, 4, "train, train2, train again, train2 again");
}

#[test]
fn time_slicing_replicas_grant_their_physical_gpu() {
    let allocs = allocations(&[("a", &[&format!("{GPU_A}::0")]), ("b", &[&format!("{GPU_A}::1")])]);
    // Both replicas of GPU-A open /dev/nvidia0 and show up in NVML on GPU-A: fine.
    let ok = [proc_in(Some("a"), &[0], &[GPU_A]), proc_in(Some("b"), &[0], &[GPU_A])];
    assert!(run(&allocs, &ok).is_empty());
    let v = run(&allocs, &[proc_in(Some("b"), &[1], &[])]);
    assert_eq!(kinds(&v), vec![(ViolationKind::UnallocatedGpuOpen, Some(GPU_B.into()))]);
}

#[test]
fn mig_devices_grant_their_parent_node_and_only_their_own_instance() {
    for id in [MIG_A0, "MIG-GPU-aaaaaaaa-0000-0000-0000-000000000000/7/0", "0:0"] {
        let allocs = allocations(&[("m", &[id])]);
        // Opening the parent node, and NVML listing it on its MIG device: fine.
        assert!(run(&allocs, &[proc_in(Some("m"), &[0], &[MIG_A0])]).is_empty(), "{id}");
        // NVML lists it on the other MIG device of the same GPU: a violation naming that device.
        let v = run(&allocs, &[proc_in(Some("m"), &[0], &[MIG_A1])]);
        assert_eq!(v.len(), 1, "{id}: {v:#?}");
        assert_eq!(v[0].kind, ViolationKind::UnallocatedGpuInNvml);
        let gpu = v[0].gpu.as_ref().unwrap();
        assert_eq!((gpu.uuid.as_deref(), gpu.mig_uuid.as_deref()), (Some(GPU_A), Some(MIG_A1)), "{id}");
        assert_eq!(v[0].evidence.nvml_uuid.as_deref(), Some(MIG_A1));
        // And opening the other GPU.
        let v = run(&allocs, &[proc_in(Some("m"), &[1], &[])]);
        assert_eq!(kinds(&v), vec![(ViolationKind::UnallocatedGpuOpen, Some(GPU_B.into()))], "{id}");
    }
    // A whole GPU grants all its MIG devices.
    let allocs = allocations(&[("w", &[GPU_A])]);
    assert!(run(&allocs, &[proc_in(Some("w"), &[0], &[MIG_A0, MIG_A1])]).is_empty());
}

#[test]
fn dra_devices_map_by_minor() {
    let dra = |name: &str| AllocatedGpu {
        raw_id: name.into(),
        via: Allocator::Dra {
            driver: "gpu.nvidia.com".into(),
            pool: "node".into(),
            claim_namespace: "ml".into(),
            claim_name: "c".into(),
        },
        device: crate::allocation::parse_dra_device_name(name).unwrap(),
        replica: None,
    };
    let mut allocs = GpuAllocations::default();
    allocs.by_container.insert(ctr("d"), vec![dra("gpu-1")]);
    allocs.by_container.insert(ctr("dm"), vec![dra("gpu-0-mig-1g18gb-0")]);
    assert!(run(&allocs, &[proc_in(Some("d"), &[1], &[GPU_B])]).is_empty());
    assert_eq!(
        kinds(&run(&allocs, &[proc_in(Some("d"), &[0], &[])])),
        vec![(ViolationKind::UnallocatedGpuOpen, Some(GPU_A.into()))]
    );
    // A DRA MIG name does not say which MIG UUID: any MIG device of its parent is accepted.
    assert!(run(&allocs, &[proc_in(Some("dm"), &[0], &[MIG_A1])]).is_empty());
    assert_eq!(run(&allocs, &[proc_in(Some("dm"), &[1], &[])]).len(), 1);
}

#[test]
fn what_cannot_be_resolved_is_counted_not_raised() {
    // The allocation names index 5, which NVML does not list: opening GPU-B might be allowed.
    let allocs = allocations(&[("x", &["5"])]);
    let mut g = Guardrails::new("/dev");
    assert!(g.evaluate(&[proc_in(Some("x"), &[1], &[GPU_B])], &map(), &allocs).is_empty());
    assert_eq!(g.counts().unresolved, 2);
    // A minor NVML does not know, for a container allocated GPU-A.
    let allocs = allocations(&[("y", &[GPU_A])]);
    assert!(g.evaluate(&[proc_in(Some("y"), &[9], &[])], &map(), &allocs).is_empty());
    assert_eq!(g.counts().unresolved, 3);
    // Without an allocation, any GPU use is a violation even when NVML cannot name the GPU.
    let v = g.evaluate(&[proc_in(Some("z"), &[9], &[])], &map(), &allocs);
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].gpu, Some(GpuRef { minor: Some(9), ..Default::default() }));
    assert_eq!(v[0].evidence.device_path.as_deref(), Some(Path::new("/dev/nvidia9")));
}

#[test]
fn gpu_map_from_an_nvml_sample() {
    use crate::nvml::model::{DeviceSample, MigInstance, NvmlSample};
    let sample = NvmlSample {
        devices: vec![DeviceSample {
            index: 0,
            uuid: GPU_A.into(),
            minor: Some(0),
            mig_instances: vec![MigInstance {
                index: 1,
                uuid: MIG_A1.into(),
                gpu_instance_id: Some(8),
                compute_instance_id: Some(0),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    let m = GpuMap::from_nvml(&sample);
    assert_eq!(m.by_minor(0).unwrap().uuid, GPU_A);
    assert_eq!(m.by_index(0).unwrap().uuid, GPU_A);
    let (parent, mig) = m.mig(MIG_A1).unwrap();
    assert_eq!((parent.uuid.as_str(), mig.gpu_instance_id), (GPU_A, Some(8)));
    assert!(m.by_uuid(GPU_B).is_none());
}

/// A child process killed when the test ends, pass or fail.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Wait until `pid` sleeps: spawn returns while the child may still be inside execve, when its
/// environment reads as empty.
fn wait_asleep(pid: u32) {
    let start = std::time::Instant::now();
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        // The state follows the `)` closing the command name.
        if stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('S')) {
            return;
        }
        assert!(start.elapsed() < std::time::Duration::from_secs(10), "{pid} never went to sleep: {stat}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn visible_devices_from_a_real_process_and_nothing_else() {
    let child = Child(
        std::process::Command::new("/bin/sleep")
            .arg("30")
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI-secret-value")
            .env("DB_PASSWORD", "hunter2-password-value")
            .env("NVIDIA_VISIBLE_DEVICES", format!("{GPU_A},{GPU_B}"))
            .env("CUDA_VISIBLE_DEVICES", "1,0")
            .env("NOT_NVIDIA_VISIBLE_DEVICES", "decoy-value")
            .spawn()
            .expect("sleep starts"),
    );
    wait_asleep(child.0.id());
    let v = read_visible_devices(Path::new("/proc"), child.0.id()).unwrap();
    assert_eq!(v, VisibleDevices { nvidia: Some(format!("{GPU_A},{GPU_B}")), cuda: Some("1,0".into()) });
    let shown = format!("{v:?} {}", serde_json::to_string(&v).unwrap());
    for secret in ["secret-value", "password-value", "decoy-value", "/usr/bin", "AWS", "PASSWORD", "PATH"] {
        assert!(!shown.contains(secret), "{secret} leaked: {shown}");
    }

    // Unset: None, not empty strings.
    let bare = Child(std::process::Command::new("/bin/sleep").arg("30").env_clear().spawn().expect("sleep starts"));
    wait_asleep(bare.0.id());
    assert_eq!(read_visible_devices(Path::new("/proc"), bare.0.id()).unwrap(), VisibleDevices::default());
}

#[test]
fn visible_devices_errors_name_the_cause() {
    let e = read_visible_devices(Path::new("/proc"), u32::MAX).unwrap_err();
    assert_eq!(e.reason(), "gone");
    assert!(e.to_string().contains("is gone"), "{e}");
    // A fixture tree: entries are split on NUL, and a value with `=` inside is kept whole.
    let dir = std::env::temp_dir().join(format!("gpu-tracer-environ-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("77")).unwrap();
    std::fs::write(dir.join("77/environ"), b"A=1\0CUDA_VISIBLE_DEVICES=MIG-x=y\0\0NVIDIA_VISIBLE_DEVICES=none\0")
        .unwrap();
    let v = read_visible_devices(&dir, 77);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(v.unwrap(), VisibleDevices { nvidia: Some("none".into()), cuda: Some("MIG-x=y".into()) });
}
