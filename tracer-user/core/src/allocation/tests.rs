use super::*;

const UUID_A: &str = "GPU-5d5c6e0b-9a0c-4f35-8d7c-3a7f0f0a1b2c";
const MIG_A: &str = "MIG-0e9c0f3a-1b2c-5d6e-8f90-a1b2c3d4e5f6";

fn gpu(uuid: &str) -> GpuDevice {
    GpuDevice::Gpu { uuid: uuid.into() }
}

#[test]
fn device_ids_parse() {
    let table: &[(&str, GpuDevice, Option<u32>)] = &[
        (UUID_A, gpu(UUID_A), None),
        ("GPU-5D5C6E0B-9A0C-4F35-8D7C-3A7F0F0A1B2C", gpu("GPU-5D5C6E0B-9A0C-4F35-8D7C-3A7F0F0A1B2C"), None),
        // Time-slicing replicas: `<id>::<replica>`.
        (&format!("{UUID_A}::0"), gpu(UUID_A), Some(0)),
        (&format!("{UUID_A}::17"), gpu(UUID_A), Some(17)),
        (MIG_A, GpuDevice::Mig { uuid: MIG_A.into() }, None),
        (&format!("{MIG_A}::2"), GpuDevice::Mig { uuid: MIG_A.into() }, Some(2)),
        (
            "MIG-GPU-5d5c6e0b-9a0c-4f35-8d7c-3a7f0f0a1b2c/7/0",
            GpuDevice::MigLegacy { parent_uuid: UUID_A.into(), gpu_instance: 7, compute_instance: 0 },
            None,
        ),
        ("0", GpuDevice::Index { index: 0 }, None),
        ("3::1", GpuDevice::Index { index: 3 }, Some(1)),
        ("1:2", GpuDevice::MigIndex { parent_index: 1, mig_index: 2 }, None),
    ];
    for (raw, device, replica) in table {
        assert_eq!(parse_device_id(raw), Ok((device.clone(), *replica)), "{raw}");
    }
}

#[test]
fn bad_device_ids_are_errors_naming_the_id() {
    let table: &[(&str, &str)] = &[
        ("", "neither a GPU/MIG UUID nor an index"),
        ("GPU-", "GPU UUID is not hex"),
        ("GPU-xyz", "GPU UUID is not hex"),
        ("MIG-", "MIG UUID is not hex"),
        ("MIG-GPU-abc/1", "legacy MIG id is not MIG-GPU-<uuid>/<gi>/<ci>"),
        ("MIG-GPU-abc/1/x", "legacy MIG compute instance is not a number"),
        ("MIG-GPU-/1/0", "legacy MIG id has no GPU UUID"),
        ("GPU-abc::x", "replica suffix `::N` is not a number"),
        ("a:b", "index id is not <gpu>:<mig>"),
        ("tpu-0", "neither a GPU/MIG UUID nor an index"),
    ];
    for (raw, why) in table {
        let e = parse_device_id(raw).unwrap_err();
        assert_eq!(e.why, *why, "{raw}");
        assert!(e.to_string().contains(&format!("{raw:?}")), "{e}");
    }
}

#[test]
fn dra_device_names_parse() {
    let table: &[(&str, Option<GpuDevice>)] = &[
        ("gpu-0", Some(GpuDevice::DraGpu { minor: 0, mig: None })),
        ("gpu-7", Some(GpuDevice::DraGpu { minor: 7, mig: None })),
        ("gpu-0-mig-1g.18gb-0", Some(GpuDevice::DraGpu { minor: 0, mig: Some("1g.18gb-0".into()) })),
        ("gpu-1-mig-1g18gb-19-0", Some(GpuDevice::DraGpu { minor: 1, mig: Some("1g18gb-19-0".into()) })),
        ("gpu-2-mig-9-4-4", Some(GpuDevice::DraGpu { minor: 2, mig: Some("9-4-4".into()) })),
        ("gpu-x", None),
        ("gpu-0-mig-", None),
        ("gpu-vfio-0", None),
        ("imex-channel-0", None),
    ];
    for (raw, want) in table {
        assert_eq!(parse_dra_device_name(raw).ok(), *want, "{raw}");
    }
}

#[test]
fn gpu_resource_names() {
    let names = GpuResourceNames::new(&["example.com/vgpu", "acme.io/gpu-*"]);
    for yes in
        ["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb", "gpu.nvidia.com", "example.com/vgpu"]
    {
        assert!(names.is_gpu(yes), "{yes}");
    }
    assert!(names.is_gpu("acme.io/gpu-big"));
    for no in ["cpu", "nvidia.com/gpu2", "example.com/vgpu2", "rdma/hca", "compute-domain.nvidia.com", ""] {
        assert!(!names.is_gpu(no), "{no}");
    }
}

fn devices(resource: &str, ids: &[&str]) -> api::ContainerDevices {
    api::ContainerDevices {
        resource_name: resource.into(),
        device_ids: ids.iter().map(|s| s.to_string()).collect(),
        topology: None,
    }
}

#[test]
fn allocations_from_a_list_answer() {
    let list = api::ListPodResourcesResponse {
        pod_resources: vec![
            api::PodResources {
                name: "train".into(),
                namespace: "ml".into(),
                containers: vec![
                    api::ContainerResources {
                        name: "main".into(),
                        devices: vec![
                            devices("nvidia.com/gpu", &[&format!("{UUID_A}::3")]),
                            devices("rdma/hca", &["x"]),
                        ],
                        cpu_ids: vec![1, 2],
                        ..Default::default()
                    },
                    api::ContainerResources { name: "sidecar".into(), ..Default::default() },
                ],
            },
            api::PodResources {
                name: "infer".into(),
                namespace: "web".into(),
                containers: vec![api::ContainerResources {
                    name: "srv".into(),
                    devices: vec![devices("nvidia.com/mig-1g.10gb", &[MIG_A, "bogus!"])],
                    dynamic_resources: vec![api::DynamicResource {
                        claim_name: "gpu-claim".into(),
                        claim_namespace: "web".into(),
                        claim_resources: vec![
                            api::ClaimResource {
                                cdi_devices: vec![api::CdiDevice { name: "k8s.gpu.nvidia.com/claim=abc-gpu-1".into() }],
                                driver_name: "gpu.nvidia.com".into(),
                                pool_name: "node-a".into(),
                                device_name: "gpu-1".into(),
                            },
                            api::ClaimResource {
                                driver_name: "compute-domain.nvidia.com".into(),
                                device_name: "channel-0".into(),
                                ..Default::default()
                            },
                        ],
                    }],
                    ..Default::default()
                }],
            },
        ],
    };
    let allocatable = api::AllocatableResourcesResponse {
        devices: vec![devices("nvidia.com/gpu", &[&format!("{UUID_A}::0"), &format!("{UUID_A}::1")])],
        ..Default::default()
    };
    let a = GpuAllocations::from_pod_resources(&list, Some(&allocatable), &GpuResourceNames::default());
    assert_eq!(a.by_container.len(), 2, "the sidecar holds no GPU: {a:#?}");
    let main = a.for_container(&ContainerRef::new("ml", "train", "main"));
    assert_eq!(main.len(), 1);
    assert_eq!(main[0].device, gpu(UUID_A));
    assert_eq!(main[0].replica, Some(3));
    assert_eq!(main[0].raw_id, format!("{UUID_A}::3"));
    assert_eq!(main[0].via, Allocator::DevicePlugin { resource: "nvidia.com/gpu".into() });
    assert!(a.for_container(&ContainerRef::new("ml", "train", "sidecar")).is_empty());

    let srv = a.for_container(&ContainerRef::new("web", "infer", "srv"));
    assert_eq!(srv.len(), 3, "{srv:#?}");
    assert_eq!(srv[0].device, GpuDevice::Mig { uuid: MIG_A.into() });
    assert!(matches!(srv[1].device, GpuDevice::Unrecognised { .. }));
    assert_eq!(srv[1].raw_id, "bogus!");
    assert_eq!(srv[2].device, GpuDevice::DraGpu { minor: 1, mig: None });
    assert_eq!(
        srv[2].via,
        Allocator::Dra {
            driver: "gpu.nvidia.com".into(),
            pool: "node-a".into(),
            claim_namespace: "web".into(),
            claim_name: "gpu-claim".into()
        }
    );
    assert_eq!(a.unrecognised_ids, 1);
    assert_eq!(a.allocatable.len(), 2);
    assert_eq!(a.allocatable[1].replica, Some(1));
}
