//! End-to-end Kubernetes identity and GPU guardrails: the real eBPF probes, real processes in
//! cgroup v2 directories named like pods' containers, the fake NVIDIA driver over FUSE, the fake
//! `libnvidia-ml.so.1` derived from it, the in-process fake API server (the real `kube` client and
//! reflector against it) and the fake kubelet pod-resources service. Every test needs root and
//! fails (never skips) without it.
//!
//! What is asserted is what the agent's snapshot says: who each cgroup is (namespace, pod,
//! container, owner, allowed labels, allocated GPUs), the names on attribution rows, allocated vs
//! used GPUs, and the exact violations raised (kind, GPU, evidence), once each.
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Mutex,
    time::{Duration, Instant},
};

use gpu_tracer_proto::podresources::v1 as api;
use gpu_tracer_tests::{
    FakeDriver, FakePodResources, PodCgroup, Tracer, Workload, config_for,
    kube_api::{FakeApiServer, FakePod},
    locate_binary,
    nvml_model::{MigSpec, NvmlModel, gpu_uuid},
    require_root,
};
use k8s_openapi::api::core::v1::Pod;
use tracer_core::{
    attribution::{ContainerKey, GpuRequest},
    config::{AttributionSettings, Config, CostPolicy, KubeSettings, NvmlSettings, SourceMode},
    guardrails::{Violation, ViolationKind},
    identity::ContainerIdentity,
    model::{AgentSnapshot, KubernetesStatus},
};

/// The node the agent says it runs on (the pod watch is restricted to it).
const NODE: &str = "identity-node";
const NS: &str = "ml";
const GIB: u64 = 1 << 30;
const WAIT: Duration = Duration::from_secs(30);

/// The probes are global kernel objects and the machine is small: one test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// A temp dir removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(what: &str) -> TempDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "gpu-tracer-identity-{what}.{}.{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Everything but the pods and workloads. Fields drop in order: the agent first, the driver and
/// the temp dir last.
struct Scene {
    t: Tracer,
    api: Option<FakeApiServer>,
    podres: Option<FakePodResources>,
    model: NvmlModel,
    /// Runs the fakes' servers in the background.
    rt: tokio::runtime::Runtime,
    driver: FakeDriver,
    dir: TempDir,
}

/// What the scene is started with.
struct SceneOpts {
    gpus: u32,
    /// Kubernetes (fake API server + pod-resources) or a plain host.
    kubernetes: bool,
    attribution: AttributionSettings,
    /// MIG instances of GPU 0 (empty: not in MIG mode).
    mig: Vec<MigSpec>,
}

impl Default for SceneOpts {
    fn default() -> Self {
        SceneOpts { gpus: 2, kubernetes: true, attribution: AttributionSettings::default(), mig: Vec::new() }
    }
}

impl Scene {
    fn start(opts: SceneOpts) -> Scene {
        let dir = TempDir::new("scene");
        let driver = FakeDriver::start(opts.gpus).unwrap();
        let mut model = NvmlModel::install(&dir.0.join("nvml"), &driver.stats().unwrap(), 512 << 20).unwrap();
        if !opts.mig.is_empty() {
            model.mig.insert(0, opts.mig);
            model.update(&driver.stats().unwrap(), &BTreeMap::new()).unwrap();
        }
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let (api, podres, kubernetes) = if opts.kubernetes {
            let api = rt.block_on(FakeApiServer::start()).unwrap();
            let podres = rt.block_on(FakePodResources::start()).unwrap();
            let kubeconfig = dir.0.join("kubeconfig");
            api.write_kubeconfig(&kubeconfig).unwrap();
            let k = KubeSettings {
                mode: SourceMode::Required,
                node_name: Some(NODE.into()),
                kubeconfig: Some(kubeconfig),
                label_allow_list: vec!["team".into()],
                pod_resources_socket: podres.socket().to_path_buf(),
                ..KubeSettings::default()
            };
            (Some(api), Some(podres), k)
        } else {
            // A plain host: auto mode, nothing configured, no kubelet socket.
            let k = KubeSettings {
                mode: SourceMode::Auto,
                node_name: None,
                kubeconfig: None,
                pod_resources_socket: dir.0.join("no-kubelet/kubelet.sock"),
                ..KubeSettings::default()
            };
            (None, None, k)
        };
        let cfg = Config {
            nvml: NvmlSettings { mode: SourceMode::Required, library: Some(model.library().to_path_buf()) },
            attribution: opts.attribution,
            kubernetes,
            ..config_for(&driver)
        };
        let mut t = Tracer::start(cfg);
        t.start_kubernetes();
        if let Some(cache) = t.agent.pod_cache() {
            let cache = cache.clone();
            assert!(t.block_on(cache.wait_ready(WAIT)), "pod watcher ready: {:?}", cache.status());
        }
        Scene { t, api, podres, model, rt, driver, dir }
    }

    fn api(&self) -> &FakeApiServer {
        self.api.as_ref().expect("a Kubernetes scene")
    }

    /// Tell the fake kubelet what each pod holds, and have the agent read it now.
    fn set_allocations(&mut self, pods: Vec<api::PodResources>, allocatable: Vec<api::ContainerDevices>) {
        let podres = self.podres.as_ref().expect("a Kubernetes scene");
        podres.set_pods(pods);
        podres.set_allocatable(api::AllocatableResourcesResponse { devices: allocatable, ..Default::default() });
        self.t.block_on(self.t.agent.refresh_allocations());
    }

    /// NVML's view rewritten from the driver's, the tracer caught up, one sample attributed and
    /// checked, and the snapshot after it.
    fn sample(&mut self) -> AgentSnapshot {
        self.model.update(&self.driver.stats().unwrap(), &BTreeMap::new()).unwrap();
        self.t.settle();
        self.t.agent.sample_now();
        self.t.agent.snapshot()
    }

    /// Sample until `pred` holds.
    fn sample_until(&mut self, what: &str, pred: impl Fn(&AgentSnapshot) -> bool) -> AgentSnapshot {
        let start = Instant::now();
        loop {
            let s = self.sample();
            if pred(&s) {
                return s;
            }
            assert!(
                start.elapsed() < WAIT,
                "timed out waiting for {what}: containers {:#?}\nkubernetes {:#?}",
                s.containers,
                s.kubernetes
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A pod of [`NODE`] whose one container `main` runs in `cg`, owned by Deployment `trainer`
/// (through ReplicaSet `trainer-7d9f8c6b5`), labelled `team` and a label not on the allow list.
fn trainer_pod(name: &str, cg: &PodCgroup, team: &str) -> Pod {
    FakePod::new(NS, name, NODE)
        .uid(cg.pod_uid())
        .label("team", team)
        .label("secret-project", "skunkworks")
        .label("pod-template-hash", "7d9f8c6b5")
        .owner("ReplicaSet", "trainer-7d9f8c6b5")
        .container("main", 1, Some(&format!("containerd://{}", cg.container_id())))
        .build()
}

/// A bare pod of [`NODE`] whose container `main` runs in `cg`, requesting `gpus` GPUs.
fn pod(name: &str, cg: &PodCgroup, gpus: u64) -> Pod {
    FakePod::new(NS, name, NODE)
        .uid(cg.pod_uid())
        .container("main", gpus, Some(&format!("containerd://{}", cg.container_id())))
        .build()
}

fn devices(resource: &str, ids: &[String]) -> api::ContainerDevices {
    api::ContainerDevices { resource_name: resource.into(), device_ids: ids.to_vec(), topology: None }
}

/// Pod-resources entry: pod `name`'s container `main` holding `ids` of `resource`.
fn holding(name: &str, resource: &str, ids: &[String]) -> api::PodResources {
    let devs = if ids.is_empty() { vec![] } else { vec![devices(resource, ids)] };
    api::PodResources {
        name: name.into(),
        namespace: NS.into(),
        containers: vec![api::ContainerResources { name: "main".into(), devices: devs, ..Default::default() }],
    }
}

/// An `nv-workload` in `cg` with `NVIDIA_VISIBLE_DEVICES` set as the container runtime sets it,
/// through a wrapper script that execs the real binary (same pid, same cgroup).
fn workload_with_env(driver: &FakeDriver, cg: &PodCgroup, dir: &Path, visible: &str) -> Workload {
    use std::os::unix::fs::PermissionsExt;
    let real = locate_binary("nv-workload").unwrap();
    let script = dir.join(format!("nv-workload-{}.sh", cg.id()));
    std::fs::write(
        &script,
        format!("#!/bin/sh\nNVIDIA_VISIBLE_DEVICES='{visible}' exec '{}' \"$@\"\n", real.display()),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    Workload::builder(driver.dev_dir()).binary(&script).cgroup(cg).spawn().unwrap()
}

fn workload(driver: &FakeDriver, cg: &PodCgroup) -> Workload {
    Workload::spawn(driver.dev_dir(), Some(cg)).unwrap()
}

fn ok(w: &mut Workload, cmd: &str) {
    let line = w.cmd(cmd).unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(line.starts_with("ok"), "{cmd} answered {line}");
}

fn ident<'a>(s: &'a AgentSnapshot, cg: &PodCgroup) -> &'a ContainerIdentity {
    s.containers.get(&cg.id()).unwrap_or_else(|| panic!("cgroup {} not in {:#?}", cg.id(), s.containers))
}

fn violations_of<'a>(s: &'a AgentSnapshot, pod: &str) -> Vec<&'a Violation> {
    s.violations.iter().filter(|v| v.pod == pod).collect()
}

/// The attribution row names of container `cg` (per GPU line and in the summary).
fn attribution_names(s: &AgentSnapshot, cg: &PodCgroup) -> Vec<Option<String>> {
    let a = s.attribution.as_ref().expect("attribution (NVML is in use)");
    let key = ContainerKey(cg.id());
    let mut names: Vec<Option<String>> =
        a.gpus.iter().flat_map(|g| &g.containers).filter(|l| l.container == key).map(|l| l.name.clone()).collect();
    names.extend(a.containers.iter().filter(|c| c.container == key).map(|c| c.name.clone()));
    names
}

#[test]
fn pods_identify_their_containers_and_follow_updates_deletes_and_outages() {
    require_root();
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut sc = Scene::start(SceneOpts::default());
    let (a, b, c) = (PodCgroup::new().unwrap(), PodCgroup::new().unwrap(), PodCgroup::new().unwrap());
    let (pa, pb, pc) = ("trainer-7d9f8c6b5-aaaaa", "trainer-7d9f8c6b5-bbbbb", "trainer-7d9f8c6b5-ccccc");
    sc.api().apply(trainer_pod(pa, &a, "ml"));
    sc.api().apply(trainer_pod(pb, &b, "ml"));
    // A pod on another node with the same container never names ours.
    sc.api().apply(FakePod::new("other", "elsewhere", "node-b").uid(c.pod_uid()).build());
    let gpu = |m: u32| vec![gpu_uuid(m)];
    sc.set_allocations(
        vec![
            holding(pa, "nvidia.com/gpu", &gpu(0)),
            holding(pb, "nvidia.com/gpu", &gpu(1)),
            holding(pc, "nvidia.com/gpu", &gpu(0)),
        ],
        vec![devices("nvidia.com/gpu", &[gpu_uuid(0), gpu_uuid(1)])],
    );
    let mut wa = workload(&sc.driver, &a);
    let mut wb = workload(&sc.driver, &b);
    ok(&mut wa, "init 0");
    ok(&mut wa, "alloc-rm 1073741824");
    ok(&mut wb, "init 1");
    ok(&mut wb, "alloc-rm 536870912");

    sc.sample_until("both pods named", |s| {
        s.containers.get(&a.id()).is_some_and(|i| i.pod.is_some())
            && s.containers.get(&b.id()).is_some_and(|i| i.pod.is_some())
    });
    // One more interval, attributed with both pods known (see the guardrails test).
    let s = sc.sample();
    let ia = ident(&s, &a);
    assert_eq!(ia.kind, "container");
    assert_eq!(ia.runtime, Some("containerd"));
    assert_eq!(ia.qos, Some("burstable"));
    assert_eq!(ia.pod_uid.as_deref(), Some(a.pod_uid()));
    assert_eq!(ia.container_id.as_deref(), Some(a.container_id()));
    assert_eq!(ia.cgroup_path.as_deref(), Some(a.relative_path()));
    assert_eq!(
        (ia.namespace.as_deref(), ia.pod.as_deref(), ia.container.as_deref()),
        (Some(NS), Some(pa), Some("main"))
    );
    assert_eq!((ia.owner_kind.as_deref(), ia.owner_name.as_deref()), (Some("Deployment"), Some("trainer")));
    // Only allow-listed labels: not `secret-project`, not `pod-template-hash`.
    assert_eq!(ia.labels, BTreeMap::from([("team".to_string(), "ml".to_string())]));
    assert_eq!(ia.gpu_requests, BTreeMap::from([("nvidia.com/gpu".to_string(), 1)]));
    assert_eq!(ia.allocated_gpus, gpu(0));
    assert!(ia.allocations_known);
    assert_eq!(ia.display_name(), format!("{NS}/{pa}/main"));
    let ib = ident(&s, &b);
    assert_eq!((ib.pod.as_deref(), ib.allocated_gpus.clone()), (Some(pb), gpu(1)));
    // Attribution rows carry the display name, on the GPU line and in the summary.
    let names = attribution_names(&s, &a);
    assert!(names.len() >= 2 && names.iter().all(|n| n.as_deref() == Some(&format!("{NS}/{pa}/main"))), "{names:?}");
    let gpu0 = s.attribution.as_ref().unwrap().gpus.iter().find(|g| g.uuid == gpu_uuid(0)).unwrap();
    assert!(gpu0.containers.iter().any(|l| l.container == ContainerKey(a.id()) && l.memory_bytes == GIB), "{gpu0:#?}");
    // Everyone uses what they hold: nothing raised, allocated == used.
    assert!(s.violations.is_empty(), "{:#?}", s.violations);
    let use_a = s.allocation_use.iter().find(|u| u.cgroup_id == a.id()).expect("allocation use of A");
    assert_eq!((use_a.allocated_gpus.clone(), use_a.used_gpus.clone()), (gpu(0), gpu(0)));
    assert!(use_a.outside_allocation.is_empty(), "{use_a:?}");
    let st = s.kubernetes.watcher.as_ref().expect("watcher status");
    assert_eq!(s.kubernetes.status, KubernetesStatus::Running);
    assert!(st.connected && st.ready && st.node == NODE, "{st:?}");

    // A label changes while the workload runs.
    sc.api().apply(trainer_pod(pa, &a, "vision"));
    let s = sc.sample_until("label change", |s| {
        s.containers.get(&a.id()).is_some_and(|i| i.labels.get("team").map(String::as_str) == Some("vision"))
    });
    assert_eq!(ident(&s, &a).pod.as_deref(), Some(pa));
    // A pod is deleted while its workload still runs: the path still says who it was.
    sc.api().delete(NS, pb).expect("pod B exists");
    let s = sc.sample_until("pod B deleted", |s| s.containers.get(&b.id()).is_some_and(|i| i.pod.is_none()));
    let ib = ident(&s, &b);
    assert_eq!((ib.namespace.as_deref(), ib.container.as_deref(), ib.owner_kind.as_deref()), (None, None, None));
    assert!(ib.labels.is_empty());
    assert_eq!((ib.kind, ib.pod_uid.as_deref()), ("container", Some(b.pod_uid())));
    assert_eq!(ident(&s, &a).pod.as_deref(), Some(pa));

    // The API server goes away: identity is answered from the cache.
    let api = sc.api.take().unwrap();
    sc.rt.block_on(api.stop());
    let s = sc.sample_until("watcher disconnected", |s| s.kubernetes.watcher.as_ref().is_some_and(|w| !w.connected));
    let ia = ident(&s, &a);
    assert_eq!((ia.pod.as_deref(), ia.owner_name.as_deref()), (Some(pa), Some("trainer")));
    assert_eq!(ia.labels.get("team").map(String::as_str), Some("vision"));
    // A pod created meanwhile appears once the server is back.
    let mut wc = workload(&sc.driver, &c);
    ok(&mut wc, "init 0");
    ok(&mut wc, "alloc-rm 268435456");
    api.apply(trainer_pod(pc, &c, "ml"));
    let s = sc.sample();
    assert_eq!(ident(&s, &c).pod, None, "not known while the server is down");
    sc.rt.block_on(api.restart()).unwrap();
    sc.api = Some(api);
    let s = sc.sample_until("pod C after the restart", |s| s.containers.get(&c.id()).is_some_and(|i| i.pod.is_some()));
    let ic = ident(&s, &c);
    assert_eq!(
        (ic.namespace.as_deref(), ic.pod.as_deref(), ic.container.as_deref()),
        (Some(NS), Some(pc), Some("main"))
    );
    assert_eq!(ic.allocated_gpus, gpu(0));
    assert_eq!(ident(&s, &a).pod.as_deref(), Some(pa));
    assert!(s.violations.is_empty(), "{:#?}", s.violations);
    drop((wa, wb, wc));
}

#[test]
fn guardrails_raise_each_misuse_once_with_evidence() {
    require_root();
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut sc = Scene::start(SceneOpts::default());
    let (a, b, c) = (PodCgroup::new().unwrap(), PodCgroup::new().unwrap(), PodCgroup::new().unwrap());
    let (pa, pb, pc) = ("greedy", "no-gpu", "all-gpus");
    sc.api().apply(pod(pa, &a, 1));
    sc.api().apply(pod(pb, &b, 0));
    sc.api().apply(pod(pc, &c, 0));
    sc.set_allocations(
        vec![
            holding(pa, "nvidia.com/gpu", &[gpu_uuid(0)]),
            holding(pb, "nvidia.com/gpu", &[]),
            holding(pc, "nvidia.com/gpu", &[]),
        ],
        vec![devices("nvidia.com/gpu", &[gpu_uuid(0), gpu_uuid(1)])],
    );
    let dir = sc.dir.0.clone();
    // A: allocated GPU 0 (and told so by the runtime), opens GPU 1.
    let mut wa = workload_with_env(&sc.driver, &a, &dir, &gpu_uuid(0));
    ok(&mut wa, "init 1");
    // B: holds no GPU, uses GPU 0.
    let mut wb = workload(&sc.driver, &b);
    ok(&mut wb, "init 0");
    ok(&mut wb, "alloc-rm 268435456");
    // C: holds no GPU, but the runtime was told to mount all of them.
    let mut wc = workload_with_env(&sc.driver, &c, &dir, "all");
    ok(&mut wc, "init 0");

    sc.sample_until("all three pods named", |s| {
        [&a, &b, &c].iter().all(|cg| s.containers.get(&cg.id()).is_some_and(|i| i.pod.is_some()))
    });
    // One more interval: the guardrails judge at the NVML sample and the snapshot's identities are
    // resolved after it, so the snapshot that first names all three may come from an interval
    // that judged a pod the watcher had not delivered yet (the watch runs on its own thread).
    let s = sc.sample();
    let va = violations_of(&s, pa);
    assert_eq!(va.len(), 1, "{va:#?}");
    let v = va[0];
    assert_eq!(v.kind, ViolationKind::UnallocatedGpuOpen);
    assert_eq!((v.namespace.as_str(), v.container.as_str(), v.pid), (NS, "main", wa.pid()));
    let g = v.gpu.as_ref().expect("the GPU");
    assert_eq!((g.uuid.clone(), g.minor, g.mig_uuid.clone()), (Some(gpu_uuid(1)), Some(1), None));
    assert_eq!(v.evidence.device_path.as_deref(), Some(sc.driver.path("nvidia1").as_path()));
    assert_eq!(v.evidence.visible_devices.nvidia.as_deref(), Some(gpu_uuid(0).as_str()));
    assert_eq!(v.evidence.allocated, vec![gpu_uuid(0)]);
    assert_eq!(v.evidence.nvml_uuid, None);

    let vb = violations_of(&s, pb);
    assert_eq!(vb.len(), 1, "an open and an NVML sighting of one GPU, same kind: one violation: {vb:#?}");
    assert_eq!(vb[0].kind, ViolationKind::GpuUseWithoutAllocation);
    assert_eq!(vb[0].pid, wb.pid());
    assert_eq!(vb[0].gpu.as_ref().and_then(|g| g.uuid.clone()), Some(gpu_uuid(0)));
    assert_eq!(vb[0].evidence.device_path.as_deref(), Some(sc.driver.path("nvidia0").as_path()));
    assert_eq!(vb[0].evidence.nvml_uuid.as_deref(), Some(gpu_uuid(0).as_str()));
    assert!(vb[0].evidence.allocated.is_empty());

    let mut vc: Vec<ViolationKind> = violations_of(&s, pc).iter().map(|v| v.kind).collect();
    vc.sort();
    assert_eq!(vc, [ViolationKind::GpuUseWithoutAllocation, ViolationKind::VisibleDevicesAllWithoutRequest]);
    let all = violations_of(&s, pc).into_iter().find(|v| v.kind == ViolationKind::VisibleDevicesAllWithoutRequest);
    let all = all.unwrap();
    assert_eq!((all.gpu.clone(), all.pid), (None, wc.pid()));
    assert_eq!(all.evidence.visible_devices.nvidia.as_deref(), Some("all"));
    assert_eq!(s.violations.len(), 4);
    let counts = s.violation_counts;
    assert_eq!(
        (counts.unallocated_gpu_open, counts.gpu_use_without_allocation, counts.visible_devices_all_without_request),
        (1, 2, 1)
    );
    assert_eq!((counts.unallocated_gpu_in_nvml, counts.unresolved), (0, 0));
    // The event stream takes each once.
    assert_eq!(sc.t.agent.take_new_violations().len(), 4);

    // Allocated vs used.
    let use_a = s.allocation_use.iter().find(|u| u.cgroup_id == a.id()).expect("allocation use of A");
    assert_eq!(use_a.name, format!("{NS}/{pa}/main"));
    assert_eq!(use_a.allocated, vec![gpu_uuid(0)]);
    assert_eq!(use_a.allocated_gpus, vec![gpu_uuid(0)]);
    assert!(use_a.used_gpus.contains(&gpu_uuid(1)), "{use_a:?}");
    assert_eq!(use_a.outside_allocation, vec![gpu_uuid(1)]);

    // Repeated samples raise nothing again.
    for _ in 0..3 {
        sc.sample();
    }
    let s = sc.sample();
    assert_eq!(s.violations.len(), 4, "{:#?}", s.violations);
    assert_eq!(s.violation_counts, counts);
    assert!(sc.t.agent.take_new_violations().is_empty());

    // A now also holds memory on GPU 1: NVML lists it there, a different kind, raised once.
    ok(&mut wa, "alloc-rm 134217728");
    let s = sc.sample();
    let va = violations_of(&s, pa);
    assert_eq!(va.len(), 2, "{va:#?}");
    let nvml = va.iter().find(|v| v.kind == ViolationKind::UnallocatedGpuInNvml).expect("NVML sighting");
    assert_eq!(nvml.evidence.nvml_uuid.as_deref(), Some(gpu_uuid(1).as_str()));
    sc.sample();
    assert_eq!(sc.sample().violations.len(), 5);
    drop((wa, wb, wc));
}

#[test]
fn time_slicing_replicas_are_allowed_and_requested_as_a_quarter() {
    require_root();
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let attribution = AttributionSettings {
        price_per_gpu_hour: Some(3600.0),
        cost_policy: CostPolicy::RequestBased,
        ..AttributionSettings::default()
    };
    let mut sc = Scene::start(SceneOpts { attribution, ..SceneOpts::default() });
    let (a, b) = (PodCgroup::new().unwrap(), PodCgroup::new().unwrap());
    let (pa, pb) = ("slice-a", "slice-b");
    sc.api().apply(pod(pa, &a, 1));
    sc.api().apply(pod(pb, &b, 1));
    let replica = |n: u32| format!("{}::{n}", gpu_uuid(0));
    let replicas: Vec<String> = (0..4).map(replica).collect();
    sc.set_allocations(
        vec![holding(pa, "nvidia.com/gpu", &[replica(0)]), holding(pb, "nvidia.com/gpu", &[replica(1)])],
        vec![devices("nvidia.com/gpu", &replicas), devices("nvidia.com/gpu", &[gpu_uuid(1)])],
    );
    let mut wa = workload(&sc.driver, &a);
    let mut wb = workload(&sc.driver, &b);
    for w in [&mut wa, &mut wb] {
        ok(w, "init 0");
        ok(w, "alloc-rm 1073741824");
    }
    sc.sample_until("both pods named", |s| {
        [&a, &b].iter().all(|cg| s.containers.get(&cg.id()).is_some_and(|i| i.pod.is_some()))
    });
    // A second interval, so that it has a length (and a price).
    std::thread::sleep(Duration::from_millis(300));
    let s = sc.sample();
    assert!(s.violations.is_empty(), "replicas of GPU 0 grant /dev/nvidia0: {:#?}", s.violations);
    assert_eq!(ident(&s, &a).allocated_gpus, vec![replica(0)]);
    assert_eq!(ident(&s, &b).allocated_gpus, vec![replica(1)]);
    for (cg, use_) in [(&a, replica(0)), (&b, replica(1))] {
        let u = s.allocation_use.iter().find(|u| u.cgroup_id == cg.id()).expect("allocation use");
        assert_eq!((u.allocated.clone(), u.allocated_gpus.clone()), (vec![use_], vec![gpu_uuid(0)]));
        assert!(u.outside_allocation.is_empty(), "{u:?}");
    }
    let at = s.attribution.as_ref().expect("attribution");
    // Each asked for a quarter of the GPU: the rightsizing request says so...
    for cg in [&a, &b] {
        let summary = at.containers.iter().find(|c| c.container == ContainerKey(cg.id())).expect("summary");
        let r = summary.rightsizing.as_ref().and_then(|r| r.request.clone());
        assert_eq!(r, Some(GpuRequest::Fraction { fraction: 0.25 }), "{summary:#?}");
    }
    // ...and the request-based cost gives each a quarter of the interval's price, the rest idle.
    let g0 = at.gpus.iter().find(|g| g.uuid == gpu_uuid(0)).expect("GPU 0");
    let cost = g0.cost.expect("a price is set");
    assert_eq!(cost.basis, tracer_core::attribution::gpu::CostBasis::RequestBased, "{g0:#?}");
    assert!(cost.price_nano > 0, "{cost:?}");
    for cg in [&a, &b] {
        let line = g0.containers.iter().find(|l| l.container == ContainerKey(cg.id())).expect("GPU 0 line");
        let c = line.cost_nano.unwrap() as i128;
        assert!((c - cost.price_nano as i128 / 4).abs() <= 1, "{c} vs price {}: {g0:#?}", cost.price_nano);
    }
    assert!((cost.idle as i128 - cost.price_nano as i128 / 2).abs() <= 2, "{cost:?}");
    drop((wa, wb));
}

#[test]
fn mig_instances_are_allowed_for_their_holder_only() {
    require_root();
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (a, b) = (PodCgroup::new().unwrap(), PodCgroup::new().unwrap());
    let mig_a = "MIG-aaaaaaaa-1111-5222-8333-444444444444".to_string();
    let mig_b = "MIG-bbbbbbbb-1111-5222-8333-444444444444".to_string();
    let spec = |uuid: &str, gi: u32| MigSpec {
        uuid: uuid.into(),
        profile: "3g.40gb".into(),
        gpu_instance_id: gi,
        compute_instance_id: 0,
        total_bytes: 40 * GIB,
        pids: Vec::new(),
    };
    let mut sc =
        Scene::start(SceneOpts { gpus: 1, mig: vec![spec(&mig_a, 1), spec(&mig_b, 2)], ..SceneOpts::default() });
    let (pa, pb) = ("mig-a", "mig-b");
    sc.api().apply(pod(pa, &a, 0));
    sc.api().apply(pod(pb, &b, 0));
    let res = "nvidia.com/mig-3g.40gb";
    sc.set_allocations(
        vec![holding(pa, res, std::slice::from_ref(&mig_a)), holding(pb, res, std::slice::from_ref(&mig_b))],
        vec![devices(res, &[mig_a.clone(), mig_b.clone()])],
    );
    let mut wa = workload(&sc.driver, &a);
    let mut wb = workload(&sc.driver, &b);
    for w in [&mut wa, &mut wb] {
        ok(w, "init 0");
        ok(w, "alloc-rm 1073741824");
    }
    let migs = sc.model.mig.get_mut(&0).unwrap();
    migs[0].pids.push(wa.pid());
    migs[1].pids.push(wb.pid());
    sc.sample_until("both pods named", |s| {
        [&a, &b].iter().all(|cg| s.containers.get(&cg.id()).is_some_and(|i| i.pod.is_some()))
    });
    // One more interval, judged with both pods known (see the guardrails test).
    let s = sc.sample();
    let sample = s.nvml.sample.as_ref().expect("an NVML sample");
    let listed: Vec<(String, Vec<u32>)> = sample.devices[0]
        .mig_instances
        .iter()
        .map(|m| (m.uuid.clone(), m.processes.iter().map(|p| p.pid).collect()))
        .collect();
    assert_eq!(listed, [(mig_a.clone(), vec![wa.pid()]), (mig_b.clone(), vec![wb.pid()])]);
    assert!(s.violations.is_empty(), "each on its own instance: {:#?}", s.violations);
    assert_eq!(ident(&s, &a).allocated_gpus, vec![mig_a.clone()]);
    for (cg, mig) in [(&a, &mig_a), (&b, &mig_b)] {
        let u = s.allocation_use.iter().find(|u| u.cgroup_id == cg.id()).expect("allocation use");
        assert_eq!(u.allocated_gpus, vec![mig.clone()]);
        assert!(u.used_gpus.contains(mig), "{u:?}");
        // Opening /dev/nvidia0 is how a MIG instance is used: not outside the allocation.
        assert!(u.outside_allocation.is_empty(), "{u:?}");
    }

    // A second process of A runs on B's instance.
    let mut wa2 = workload(&sc.driver, &a);
    ok(&mut wa2, "init 0");
    ok(&mut wa2, "alloc-rm 536870912");
    sc.model.mig.get_mut(&0).unwrap()[1].pids.push(wa2.pid());
    let s = sc.sample();
    assert_eq!(s.violations.len(), 1, "{:#?}", s.violations);
    let v = &s.violations[0];
    assert_eq!(v.kind, ViolationKind::UnallocatedGpuInNvml);
    assert_eq!((v.pod.as_str(), v.container.as_str(), v.pid), (pa, "main", wa2.pid()));
    let g = v.gpu.as_ref().unwrap();
    assert_eq!((g.uuid.clone(), g.mig_uuid.clone()), (Some(gpu_uuid(0)), Some(mig_b.clone())));
    assert_eq!(v.evidence.nvml_uuid.as_deref(), Some(mig_b.as_str()));
    assert_eq!(v.evidence.allocated, vec![mig_a.clone()]);
    sc.sample();
    assert_eq!(sc.sample().violations.len(), 1);
    drop((wa, wb, wa2));
}

#[test]
fn a_plain_host_has_cgroup_identity_and_no_kubernetes() {
    require_root();
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // The premise: nothing on this host says where an API server is.
    for var in ["KUBECONFIG", "KUBERNETES_SERVICE_HOST"] {
        assert!(std::env::var_os(var).is_none_or(|v| v.is_empty()), "this test needs ${var} unset");
    }
    if let Some(home) = std::env::var_os("HOME") {
        let kc = Path::new(&home).join(".kube/config");
        assert!(!kc.exists(), "this test needs a host without {}", kc.display());
    }
    let mut sc = Scene::start(SceneOpts { kubernetes: false, ..SceneOpts::default() });
    let a = PodCgroup::new().unwrap();
    let mut w = workload(&sc.driver, &a);
    ok(&mut w, "init 0");
    ok(&mut w, "alloc-rm 1073741824");
    let s = sc.sample();
    assert_eq!(s.kubernetes.status, KubernetesStatus::NotInUse, "{:?}", s.kubernetes);
    assert!(s.kubernetes.detail.contains("not in use"), "{:?}", s.kubernetes);
    assert!(s.kubernetes.watcher.is_none() && s.kubernetes.pod_resources.is_none(), "{:?}", s.kubernetes);
    let i = ident(&s, &a);
    assert_eq!((i.kind, i.runtime), ("container", Some("containerd")));
    assert_eq!(i.pod_uid.as_deref(), Some(a.pod_uid()));
    assert_eq!(i.container_id.as_deref(), Some(a.container_id()));
    assert_eq!((i.namespace.clone(), i.pod.clone(), i.container.clone()), (None, None, None));
    assert!(!i.allocations_known && i.allocated_gpus.is_empty());
    let short = format!("pod {}/{}", &a.pod_uid()[..8], &a.container_id()[..8]);
    assert_eq!(i.display_name(), short);
    // Attributed all the same, under the name the path gives.
    let names = attribution_names(&s, &a);
    assert!(!names.is_empty() && names.iter().all(|n| n.as_deref() == Some(short.as_str())), "{names:?}");
    assert!(s.violations.is_empty() && s.allocation_use.is_empty(), "{:#?}", s.violations);
    assert_eq!(s.violation_counts, Default::default());
    drop(w);
}
