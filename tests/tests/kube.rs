//! Kubernetes identity against the in-process fake API server: the real `kube` client and
//! reflector, through HTTP, as on a node. No root needed.
//!
//! The node agent runs its tokio runtime with the `current_thread` flavour; these tests do too, so
//! the watcher is shown to make progress there.

use std::path::PathBuf;
use std::time::Duration;

use gpu_tracer_tests::kube_api::{FakeApiServer, FakePod};
use k8s_openapi::api::core::v1::Pod;
use tracer_agent::identity::kube::{KubeEnv, KubeError, KubeStart, PodCache, PodWatcher, WatchOptions};
use tracer_core::config::{KubeSettings, SourceMode};

const NODE: &str = "node-a";
const CID1: &str = "1111111111111111111111111111111111111111111111111111111111111111";
const CID2: &str = "2222222222222222222222222222222222222222222222222222222222222222";
const WAIT: Duration = Duration::from_secs(30);

/// Poll `f` every 25 ms (yielding to the runtime) until it returns `Some`, or panic after `timeout`.
async fn eventually<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = tokio::time::Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < timeout, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn settings() -> KubeSettings {
    KubeSettings {
        node_name: Some(NODE.into()),
        label_allow_list: vec!["team".into(), "app.kubernetes.io/name".into()],
        ..KubeSettings::default()
    }
}

fn options(page_size: u32) -> WatchOptions {
    WatchOptions { page_size, probe_interval: Duration::from_millis(200), ready_timeout: Duration::from_secs(10) }
}

/// A watcher on `server` for [`NODE`], ready (first list complete).
async fn watch(server: &FakeApiServer, page_size: u32) -> PodWatcher {
    let client = kube::Client::try_from(server.client_config()).expect("client");
    let w = PodWatcher::spawn(client, NODE.into(), server.url(), &settings(), options(page_size));
    assert!(w.cache().wait_ready(WAIT).await, "first list: {:?}", w.cache().status());
    w
}

fn gpu_pod(name: &str, node: &str, uid: &str, cid: &str) -> Pod {
    FakePod::new("ml", name, node).uid(uid).container("main", 1, Some(&format!("containerd://{cid}"))).build()
}

fn uid(n: u32) -> String {
    format!("{n:08x}-1a2b-4c3d-9e8f-0a1b2c3d4e5f")
}

fn names(cache: &PodCache) -> Vec<String> {
    let mut v: Vec<String> = cache.pods().into_iter().map(|p| p.name).collect();
    v.sort();
    v
}

fn systemd_path(uid: &str, cid: &str) -> String {
    let u = uid.replace('-', "_");
    format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{cid}.scope")
}

#[tokio::test(flavor = "current_thread")]
async fn initial_paged_list_fills_the_cache_with_this_nodes_pods_only() {
    let server = FakeApiServer::start().await.unwrap();
    for i in 0..5 {
        server.apply(FakePod::new("ml", &format!("train-{i}"), NODE).uid(&uid(i)).build());
    }
    server.apply(gpu_pod("gpu-0", NODE, &uid(10), CID1));
    server.apply(gpu_pod("elsewhere", "node-b", &uid(11), CID2));
    let w = watch(&server, 2).await;
    let cache = w.cache();

    assert_eq!(names(&cache), ["gpu-0", "train-0", "train-1", "train-2", "train-3", "train-4"]);
    let status = cache.status();
    assert!(status.connected && status.ready, "{status:?}");
    assert_eq!((status.pods_cached, status.relists, status.node.as_str()), (6, 0, NODE));
    // The list was paged (6 pods, 2 per page: 3 requests) and restricted to this node.
    let lists: Vec<String> =
        server.requests().into_iter().filter(|r| r.starts_with("/api/v1/pods?") && !r.contains("watch=true")).collect();
    assert_eq!(lists.len(), 3, "{lists:?}");
    assert!(
        lists.iter().all(|r| r.contains("limit=2") && r.contains("fieldSelector=spec.nodeName%3Dnode-a")),
        "{lists:?}"
    );
    assert!(lists[1].contains("continue="), "{lists:?}");

    // Lookups: pod UID, container id (bare or as in pod status), cgroup path.
    let by_uid = cache.by_pod_uid(&uid(10)).expect("by uid");
    assert_eq!((by_uid.namespace.as_str(), by_uid.name.as_str(), by_uid.container_name), ("ml", "gpu-0", None));
    assert_eq!(by_uid.node.as_deref(), Some(NODE));
    let by_ctr = cache.by_container_id(CID1).expect("by container id");
    assert_eq!((by_ctr.name.as_str(), by_ctr.container_name.as_deref()), ("gpu-0", Some("main")));
    assert_eq!(cache.by_container_id(&format!("containerd://{CID1}")), Some(by_ctr.clone()));
    assert_eq!(cache.by_cgroup_path(&systemd_path(&uid(10), CID1)), Some(by_ctr));
    // A cgroup whose container the pod status does not list (the sandbox): the pod, no container.
    let sandbox = cache.by_cgroup_path(&systemd_path(&uid(10), CID2)).expect("by pod uid");
    assert_eq!((sandbox.name.as_str(), sandbox.container_name), ("gpu-0", None));
    // Pods on other nodes never appear.
    assert_eq!(cache.by_pod_uid(&uid(11)), None);
    assert_eq!(cache.by_container_id(CID2), None);
    assert_eq!(cache.by_cgroup_path("/system.slice/sshd.service"), None);
}

#[tokio::test(flavor = "current_thread")]
async fn adds_label_changes_and_deletes_while_running_are_reflected() {
    let server = FakeApiServer::start().await.unwrap();
    let w = watch(&server, 500).await;
    let cache = w.cache();
    assert!(cache.pods().is_empty());

    server.apply(FakePod::new("ml", "a", NODE).uid(&uid(1)).label("team", "vision").build());
    let p = eventually("pod a", WAIT, || cache.by_pod_uid(&uid(1))).await;
    assert_eq!(p.labels.get("team").map(String::as_str), Some("vision"));

    server.apply(FakePod::new("ml", "a", NODE).uid(&uid(1)).label("team", "speech").build());
    eventually("label change", WAIT, || {
        cache.by_pod_uid(&uid(1)).filter(|p| p.labels.get("team").map(String::as_str) == Some("speech"))
    })
    .await;

    // A container starts: its id appears in the pod status.
    server.apply(gpu_pod("a", NODE, &uid(1), CID1));
    eventually("container id", WAIT, || cache.by_container_id(CID1)).await;

    server.apply(FakePod::new("ml", "b-elsewhere", "node-b").uid(&uid(2)).build());
    server.delete("ml", "a").expect("pod a exists");
    eventually("pod a gone", WAIT, || cache.by_pod_uid(&uid(1)).is_none().then_some(())).await;
    assert_eq!(cache.by_container_id(CID1), None);
    assert_eq!(cache.by_pod_uid(&uid(2)), None);
    assert_eq!(cache.status().pods_cached, 0);
}

#[tokio::test(flavor = "current_thread")]
async fn compaction_gives_410_then_a_relist_that_catches_up() {
    let server = FakeApiServer::start().await.unwrap();
    server.apply(FakePod::new("ml", "old", NODE).uid(&uid(1)).build());
    server.apply(FakePod::new("ml", "doomed", NODE).uid(&uid(2)).build());
    let w = watch(&server, 500).await;
    let cache = w.cache();
    // Let a bookmark arrive so the watcher has a resume point.
    tokio::time::sleep(Duration::from_millis(700)).await;

    server.compact_and_drop_watches();
    // Changes the watcher cannot replay: they are past the compaction point only through a list.
    server.delete("ml", "doomed");
    server.apply(FakePod::new("ml", "new", NODE).uid(&uid(3)).build());

    eventually("relist", WAIT, || (names(&cache) == ["new", "old"]).then_some(())).await;
    let status = cache.status();
    assert!(status.relists >= 1, "{status:?}");
    let log = server.requests();
    let lists = log.iter().filter(|r| r.starts_with("/api/v1/pods?") && !r.contains("watch=true")).count();
    assert!(lists >= 2, "a second list after 410: {log:?}");
    assert!(status.last_error.as_deref().is_some_and(|e| e.contains("410") || e.contains("too old")), "{status:?}");
    assert!(cache.by_pod_uid(&uid(1)).is_some() && cache.by_pod_uid(&uid(2)).is_none());
}

#[tokio::test(flavor = "current_thread")]
async fn api_server_outage_keeps_the_cache_and_recovers() {
    let server = FakeApiServer::start().await.unwrap();
    server.apply(gpu_pod("steady", NODE, &uid(1), CID1));
    let w = watch(&server, 500).await;
    let cache = w.cache();

    server.stop().await;
    let status = eventually("disconnected", WAIT, || Some(cache.status()).filter(|s| !s.connected)).await;
    assert!(status.last_error.is_some() && status.errors > 0, "{status:?}");
    // The cache keeps answering meanwhile.
    let p = cache.by_container_id(CID1).expect("cached identity survives the outage");
    assert_eq!(p.name, "steady");
    assert_eq!(cache.by_cgroup_path(&systemd_path(&uid(1), CID1)).map(|p| p.name), Some("steady".into()));

    // The cluster moves on while this node cannot see it.
    server.apply(gpu_pod("fresh", NODE, &uid(2), CID2));
    server.restart().await.unwrap();
    let p = eventually("pod created during the outage", WAIT, || cache.by_container_id(CID2)).await;
    assert_eq!(p.name, "fresh");
    eventually("connected", WAIT, || cache.status().connected.then_some(())).await;
    assert_eq!(names(&cache), ["fresh", "steady"]);
}

#[tokio::test(flavor = "current_thread")]
async fn labels_are_allow_listed_and_owners_resolved() {
    let server = FakeApiServer::start().await.unwrap();
    let deployment = FakePod::new("ml", "web-5d4f8b7c9-x2x7q", NODE)
        .uid(&uid(1))
        .label("team", "vision")
        .label("app.kubernetes.io/name", "web")
        .label("pod-template-hash", "5d4f8b7c9")
        .label("secret-project", "x")
        .annotation("big", &"y".repeat(1000))
        .owner("ReplicaSet", "web-5d4f8b7c9")
        .container("main", 2, Some(&format!("containerd://{CID1}")))
        .container("sidecar", 0, None);
    server.apply(deployment.build());
    server.apply(
        FakePod::new("batch", "nightly-29000000-abcde", NODE).uid(&uid(2)).owner("Job", "nightly-29000000").build(),
    );
    server.apply(FakePod::new("batch", "once-abcde", NODE).uid(&uid(3)).owner("Job", "once").build());
    server.apply(FakePod::new("db", "pg-0", NODE).uid(&uid(4)).owner("StatefulSet", "pg").build());
    server.apply(FakePod::new("ml", "bare", NODE).uid(&uid(5)).build());
    let w = watch(&server, 500).await;
    let cache = w.cache();

    let p = cache.by_container_id(CID1).unwrap();
    let labels: Vec<(&str, &str)> = p.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(labels, [("app.kubernetes.io/name", "web"), ("team", "vision")]);
    assert_eq!((p.owner_kind.as_deref(), p.owner_name.as_deref()), (Some("Deployment"), Some("web")));
    assert_eq!(p.gpu_requests.len(), 1, "only containers asking for GPUs: {:?}", p.gpu_requests);
    assert_eq!(p.gpu_requests["main"]["nvidia.com/gpu"], 2);
    let owner = |n| cache.by_pod_uid(&uid(n)).map(|p| (p.owner_kind, p.owner_name)).unwrap();
    assert_eq!(owner(2), (Some("CronJob".into()), Some("nightly".into())));
    assert_eq!(owner(3), (Some("Job".into()), Some("once".into())));
    assert_eq!(owner(4), (Some("StatefulSet".into()), Some("pg".into())));
    assert_eq!(owner(5), (None, None));
    assert!(cache.by_pod_uid(&uid(5)).unwrap().labels.is_empty());
}

#[tokio::test(flavor = "current_thread")]
async fn dra_versions_are_discovered() {
    let server = FakeApiServer::start().await.unwrap();
    server.set_dra_versions(&["v1", "v1beta2", "v1beta1"]);
    let w = watch(&server, 500).await;
    let found = eventually("discovery", WAIT, || w.cache().status().dra_versions).await;
    assert_eq!(found, ["v1", "v1beta2", "v1beta1"]);

    let plain = FakeApiServer::start().await.unwrap();
    let w = watch(&plain, 500).await;
    assert!(eventually("discovery", WAIT, || w.cache().status().dra_versions).await.is_empty());
}

/// A host with no kubeconfig anywhere and no in-cluster environment.
fn bare_host(tag: &str) -> (KubeEnv, PathBuf) {
    let home = std::env::temp_dir().join(format!("gpu-tracer-kube-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&home).unwrap();
    let env = KubeEnv { home: Some(home.clone()), hostname: Some("host".into()), ..KubeEnv::default() };
    (env, home)
}

#[tokio::test(flavor = "current_thread")]
async fn modes_without_kubernetes() {
    let (env, home) = bare_host("modes");
    let auto = KubeSettings { mode: SourceMode::Auto, ..settings() };
    let started = PodWatcher::start_with(&auto, &env, options(500)).await.expect("auto never fails here");
    let KubeStart::NotInUse { reason } = &started else { panic!("expected not in use: {started:?}") };
    assert!(reason.contains("KUBERNETES_SERVICE_HOST") && reason.contains(".kube/config"), "{reason}");
    assert!(started.describe().starts_with("Kubernetes not in use"), "{}", started.describe());

    let required = KubeSettings { mode: SourceMode::Required, ..settings() };
    let err = PodWatcher::start_with(&required, &env, options(500)).await.expect_err("required must fail");
    assert!(matches!(err, KubeError::NotConfigured { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("kubernetes.kubeconfig") && msg.contains("mode = \"auto\""), "names cause and fix: {msg}");

    let off = KubeSettings { mode: SourceMode::Off, ..settings() };
    assert!(matches!(PodWatcher::start_with(&off, &env, options(500)).await, Ok(KubeStart::Off)));

    // A kubeconfig that does not load: auto keeps going without pods, required fails naming the file.
    let broken = home.join("broken");
    std::fs::write(&broken, "not: [valid").unwrap();
    let auto_broken = KubeSettings { kubeconfig: Some(broken.clone()), ..auto };
    let started = PodWatcher::start_with(&auto_broken, &env, options(500)).await.unwrap();
    assert!(matches!(started, KubeStart::Unavailable { error: KubeError::Kubeconfig { .. } }), "{started:?}");
    let required_broken = KubeSettings { kubeconfig: Some(broken.clone()), ..required };
    let err = PodWatcher::start_with(&required_broken, &env, options(500)).await.unwrap_err();
    assert!(err.to_string().contains(&broken.display().to_string()), "{err}");
    std::fs::remove_dir_all(home).unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn required_mode_through_a_kubeconfig() {
    let (env, home) = bare_host("required");
    let server = FakeApiServer::start().await.unwrap();
    server.apply(gpu_pod("p", NODE, &uid(1), CID1));
    let kubeconfig = home.join("config");
    server.write_kubeconfig(&kubeconfig).unwrap();
    // The node name comes from $NODE_NAME when the settings do not say.
    let env = KubeEnv { node_name_var: Some(NODE.into()), ..env };
    let required = KubeSettings {
        mode: SourceMode::Required,
        kubeconfig: Some(kubeconfig.clone()),
        node_name: None,
        ..settings()
    };
    let started = PodWatcher::start_with(&required, &env, options(500)).await.expect("starts");
    let cache = started.cache().expect("running");
    // Required mode returns only once the first list is in.
    assert_eq!(cache.by_container_id(CID1).map(|p| p.name), Some("p".into()));
    assert_eq!(cache.status().server, format!("{}/", server.url()));
    drop(started);

    // The server is down: required mode gives up after its ready timeout, naming the server.
    server.stop().await;
    let opts = WatchOptions { ready_timeout: Duration::from_secs(2), ..options(500) };
    let err = PodWatcher::start_with(&required, &env, opts).await.expect_err("unreachable");
    assert!(matches!(err, KubeError::NotReady { .. }), "{err:?}");
    assert!(err.to_string().contains(&server.url()), "{err}");
    std::fs::remove_dir_all(home).unwrap();
}

/// The double itself, through the plain client: what the watcher depends on.
#[tokio::test(flavor = "current_thread")]
async fn fake_api_server_behaves_like_one() {
    use futures::TryStreamExt;
    use kube::api::{Api, ListParams};
    use kube::runtime::{WatchStreamExt, reflector, watcher};

    let server = FakeApiServer::start().await.unwrap();
    server.apply(FakePod::new("ml", "a", NODE).build());
    server.apply(FakePod::new("ml", "b", "node-b").build());
    let client = kube::Client::try_from(server.client_config()).unwrap();
    assert_eq!(client.apiserver_version().await.unwrap().minor, "34");

    let pods: Api<Pod> = Api::all(client.clone());
    let bad = pods.list(&ListParams::default().fields("status.phase=Running")).await.unwrap_err();
    assert!(matches!(&bad, kube::Error::Api(s) if s.code == 400), "{bad:?}");
    let ns: Api<Pod> = Api::namespaced(client.clone(), "ml");
    assert_eq!(ns.get("a").await.unwrap().metadata.name.as_deref(), Some("a"));
    let missing = ns.get("zzz").await.unwrap_err();
    assert!(matches!(&missing, kube::Error::Api(s) if s.code == 404), "{missing:?}");
    let mine = pods.list(&ListParams::default().fields(&format!("spec.nodeName={NODE}"))).await.unwrap();
    assert_eq!(mine.items.len(), 1);

    // Streaming lists: initial events end with the initial-events-end bookmark.
    let (store, writer) = reflector::store::<Pod>();
    let cfg = watcher::Config::default().streaming_lists().fields(&format!("spec.nodeName={NODE}"));
    let stream = watcher(pods, cfg).reflect(writer).applied_objects();
    let task = tokio::spawn(async move { stream.try_for_each(|_| async { Ok(()) }).await });
    tokio::time::timeout(WAIT, store.wait_until_ready()).await.expect("ready").unwrap();
    assert_eq!(store.len(), 1);
    assert!(server.requests().iter().any(|r| r.contains("sendInitialEvents=true")));
    eventually("watch open", WAIT, || (server.watch_count() == 1).then_some(())).await;
    task.abort();
}
