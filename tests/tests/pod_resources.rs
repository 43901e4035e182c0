//! The agent's kubelet pod-resources client and `AllocationSource` against the pod-resources
//! double on a Unix socket. No root needed.

use std::path::Path;
use std::time::{Duration, Instant};

use gpu_tracer_proto::podresources::v1 as api;
use gpu_tracer_tests::FakePodResources;
use tracer_agent::allocation::{
    pod_resources::{PodResourcesClient, PodResourcesError},
    source::AllocationSource,
};
use tracer_core::allocation::{Allocator, ContainerRef, GpuDevice};
use tracer_core::config::{KubeSettings, SourceMode};

const GPU_A: &str = "GPU-5d5c6e0b-9a0c-4f35-8d7c-3a7f0f0a1b2c";
const MIG_B: &str = "MIG-0e9c0f3a-1b2c-5d6e-8f90-a1b2c3d4e5f6";

fn devices(resource: &str, ids: &[&str]) -> api::ContainerDevices {
    api::ContainerDevices {
        resource_name: resource.into(),
        device_ids: ids.iter().map(|s| s.to_string()).collect(),
        topology: Some(api::TopologyInfo { nodes: vec![api::NumaNode { id: 0 }] }),
    }
}

fn container(name: &str, devs: Vec<api::ContainerDevices>, dra: Vec<api::DynamicResource>) -> api::ContainerResources {
    api::ContainerResources {
        name: name.into(),
        devices: devs,
        cpu_ids: vec![2, 3],
        memory: vec![api::ContainerMemory { memory_type: "memory".into(), size: 1 << 30, topology: None }],
        dynamic_resources: dra,
    }
}

/// Two time-slicing replicas of GPU-A in two pods, a MIG device, a DRA claim and a CPU-only pod.
fn pods() -> Vec<api::PodResources> {
    vec![
        api::PodResources {
            name: "train-0".into(),
            namespace: "ml".into(),
            containers: vec![container("main", vec![devices("nvidia.com/gpu", &[&format!("{GPU_A}::0")])], vec![])],
        },
        api::PodResources {
            name: "train-1".into(),
            namespace: "ml".into(),
            containers: vec![container("main", vec![devices("nvidia.com/gpu", &[&format!("{GPU_A}::1")])], vec![])],
        },
        api::PodResources {
            name: "infer".into(),
            namespace: "web".into(),
            containers: vec![
                container("srv", vec![devices("nvidia.com/mig-1g.18gb", &[MIG_B])], vec![]),
                container(
                    "dra",
                    vec![],
                    vec![api::DynamicResource {
                        claim_name: "one-gpu".into(),
                        claim_namespace: "web".into(),
                        claim_resources: vec![api::ClaimResource {
                            cdi_devices: vec![api::CdiDevice { name: "k8s.gpu.nvidia.com/claim=1234-gpu-1".into() }],
                            driver_name: "gpu.nvidia.com".into(),
                            pool_name: "node-a".into(),
                            device_name: "gpu-1".into(),
                        }],
                    }],
                ),
            ],
        },
        api::PodResources {
            name: "web".into(),
            namespace: "web".into(),
            containers: vec![container("nginx", vec![devices("example.com/nic", &["nic0"])], vec![])],
        },
    ]
}

fn settings(socket: &Path, mode: SourceMode) -> KubeSettings {
    KubeSettings { mode, pod_resources_socket: socket.into(), ..Default::default() }
}

#[tokio::test]
async fn list_get_and_allocatable_round_trip() {
    let fake = FakePodResources::start().await.unwrap();
    fake.set_pods(pods());
    let allocatable = api::AllocatableResourcesResponse {
        devices: vec![
            devices("nvidia.com/gpu", &[&format!("{GPU_A}::0"), &format!("{GPU_A}::1"), &format!("{GPU_A}::2")]),
            devices("nvidia.com/mig-1g.18gb", &[MIG_B]),
        ],
        cpu_ids: vec![0, 1, 2, 3],
        memory: vec![],
    };
    fake.set_allocatable(allocatable.clone());

    let client = PodResourcesClient::connect(fake.socket()).await.unwrap();
    // Every field survives the trip (the DRA claim's field numbers 2..4 included).
    assert_eq!(client.list().await.unwrap().pod_resources, pods());
    assert_eq!(client.allocatable().await.unwrap(), allocatable);
    assert_eq!(client.get("web", "infer").await.unwrap(), Some(pods()[2].clone()));
    // The kubelet's answer for an unknown pod is gRPC Unknown; the client reads it as "no such pod".
    assert_eq!(client.get("web", "nope").await.unwrap(), None);
    assert_eq!(fake.calls().get, 2);

    let source = AllocationSource::start(&settings(fake.socket(), SourceMode::Required), Duration::from_secs(3600))
        .await
        .unwrap()
        .expect("not Off");
    let a = source.current().expect("answered");
    assert_eq!(a.by_container.len(), 4, "the CPU/NIC-only container holds no GPU: {a:#?}");
    for (pod, replica) in [("train-0", 0), ("train-1", 1)] {
        let g = a.for_container(&ContainerRef::new("ml", pod, "main"));
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].device, GpuDevice::Gpu { uuid: GPU_A.into() });
        assert_eq!(g[0].replica, Some(replica));
    }
    let srv = a.for_container(&ContainerRef::new("web", "infer", "srv"));
    assert_eq!(srv[0].device, GpuDevice::Mig { uuid: MIG_B.into() });
    assert_eq!(srv[0].via, Allocator::DevicePlugin { resource: "nvidia.com/mig-1g.18gb".into() });
    let dra = a.for_container(&ContainerRef::new("web", "infer", "dra"));
    assert_eq!(dra[0].device, GpuDevice::DraGpu { minor: 1, mig: None });
    assert_eq!(
        dra[0].via,
        Allocator::Dra {
            driver: "gpu.nvidia.com".into(),
            pool: "node-a".into(),
            claim_namespace: "web".into(),
            claim_name: "one-gpu".into()
        }
    );
    assert_eq!(a.allocatable.len(), 4);
    let status = source.status();
    assert!(status.available && status.last_error.is_none() && status.allocatable_error.is_none(), "{status:?}");
    assert_eq!((status.refreshes, status.failures), (1, 0));
}

#[tokio::test]
async fn get_unknown_pod_is_grpc_unknown_on_the_wire() {
    // Checks the double itself against the kubelet's behaviour, with the raw generated client.
    let fake = FakePodResources::start().await.unwrap();
    let socket = fake.socket().to_path_buf();
    let channel = tonic::transport::Endpoint::from_static("http://[::]:50051")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let socket = socket.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tokio::net::UnixStream::connect(socket).await?))
            }
        }))
        .await
        .unwrap();
    let mut raw = api::pod_resources_lister_client::PodResourcesListerClient::new(channel);
    let status =
        raw.get(api::GetPodResourcesRequest { pod_name: "p".into(), pod_namespace: "ns".into() }).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unknown);
    assert_eq!(status.message(), "pod p in namespace ns not found");
}

#[tokio::test]
async fn socket_absent_auto_keeps_going_required_fails_off_does_nothing() {
    let dir = std::env::temp_dir().join(format!("gpu-tracer-no-kubelet-{}", std::process::id()));
    let socket = dir.join("kubelet.sock");

    let auto = AllocationSource::start(&settings(&socket, SourceMode::Auto), Duration::from_secs(3600))
        .await
        .expect("auto does not fail")
        .expect("auto runs");
    assert!(auto.current().is_none());
    let status = auto.status();
    assert!(!status.available);
    assert_eq!(status.failures, 1);
    let err = status.last_error.unwrap();
    assert!(err.starts_with(&format!("kubelet pod-resources not available at {}", socket.display())), "{err}");

    let required = AllocationSource::start(&settings(&socket, SourceMode::Required), Duration::from_secs(3600)).await;
    let Err(e) = required else { panic!("Required must fail without the socket") };
    assert!(matches!(e, PodResourcesError::SocketMissing { .. }), "{e:?}");
    assert_eq!(e.reason(), "socket_missing");
    let msg = e.to_string();
    assert!(msg.contains(&socket.display().to_string()), "names the path: {msg}");
    assert!(msg.contains("hostPath") && msg.contains("kubernetes.pod_resources_socket"), "names the fix: {msg}");

    let off = AllocationSource::start(&settings(&socket, SourceMode::Off), Duration::from_secs(3600)).await.unwrap();
    assert!(off.is_none());
}

#[tokio::test]
async fn stopped_kubelet_keeps_the_last_answer_and_a_restart_refreshes() {
    let mut fake = FakePodResources::start().await.unwrap();
    fake.set_pods(pods());
    let source = AllocationSource::start(&settings(fake.socket(), SourceMode::Auto), Duration::from_secs(3600))
        .await
        .unwrap()
        .unwrap();
    let first = source.current().unwrap();
    assert_eq!(first.by_container.len(), 4);

    fake.stop().await.unwrap();
    assert!(source.refresh().await.is_err());
    assert_eq!(source.current().unwrap(), first, "the last good answer is kept");
    let status = source.status();
    assert!(!status.available, "{status:?}");
    assert_eq!((status.refreshes, status.failures), (1, 1));
    assert!(status.last_success_unix_ns.is_some());
    let err = status.last_error.expect("says why");
    assert!(err.contains("kubelet pod-resources"), "{err}");

    // Back, with one pod fewer: the next refresh reconnects and replaces the answer.
    let mut fewer = pods();
    fewer.remove(0);
    fake.set_pods(fewer);
    fake.restart().await.unwrap();
    source.refresh().await.unwrap();
    let now = source.current().unwrap();
    assert_eq!(now.by_container.len(), 3);
    assert!(now.for_container(&ContainerRef::new("ml", "train-0", "main")).is_empty());
    let status = source.status();
    assert!(status.available && status.last_error.is_none(), "{status:?}");
    assert_eq!((status.refreshes, status.failures), (2, 1));
}

#[tokio::test]
async fn the_poller_refreshes_on_its_own() {
    let mut fake = FakePodResources::start().await.unwrap();
    let source = AllocationSource::start(&settings(fake.socket(), SourceMode::Required), Duration::from_millis(50))
        .await
        .unwrap()
        .unwrap();
    assert!(source.current().unwrap().by_container.is_empty());
    fake.set_pods(pods());
    wait_until("the poller sees the new pods", || source.current().is_some_and(|a| a.by_container.len() == 4)).await;
    fake.stop().await.unwrap();
    wait_until("the poller notices the kubelet is gone", || !source.status().available).await;
    assert_eq!(source.current().unwrap().by_container.len(), 4);
    fake.set_pods(vec![]);
    fake.restart().await.unwrap();
    wait_until("the poller reconnects", || source.current().is_some_and(|a| a.by_container.is_empty())).await;
    assert!(fake.calls().list >= 3);
}

async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < Duration::from_secs(10), "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
