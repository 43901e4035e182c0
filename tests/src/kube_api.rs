//! [`FakeApiServer`]: an in-process Kubernetes API server for pods, good enough for the real `kube`
//! client and `kube::runtime` watcher/reflector to run against it unchanged.
//!
//! It serves, over plain HTTP on `127.0.0.1:<random port>`:
//! * `GET /api/v1/pods` and `/api/v1/namespaces/{ns}/pods`: list (paged with `limit` /
//!   `continue`) or, with `watch=true`, a watch: newline-delimited `{"type","object"}` events on a
//!   chunked response, replayed from the requested `resourceVersion`, with BOOKMARKs every
//!   [`FakeApiServer::set_bookmark_interval`] and the stream ending after `timeoutSeconds`; streaming
//!   lists (`sendInitialEvents=true`) end their initial events with the `k8s.io/initial-events-end`
//!   bookmark;
//! * `GET /api/v1/namespaces/{ns}/pods/{name}`;
//! * field selectors on `spec.nodeName`, `metadata.name`, `metadata.namespace` (`=`, `==`, `!=`);
//!   others get 400 "field label not supported", as from a real server;
//! * `GET /version`, `/api`, `/apis` (with `resource.k8s.io` at the versions a test chooses).
//!
//! Tests drive it with [`FakeApiServer::apply`] / [`FakeApiServer::delete`] (each write gets the next
//! global `resourceVersion`), [`FakeApiServer::compact_and_drop_watches`] (history forgotten, watches
//! cut: a client resuming from an old version gets `410 Gone` and must relist), and
//! [`FakeApiServer::stop`] / [`FakeApiServer::restart`] (the server goes away, every connection
//! cut, and comes back on the same port with the same data). Every request URI is logged.
//!
//! Not modelled: consistent-snapshot paging (a continue token is an offset, though it expires
//! with compaction like a real one), protobuf, authentication, other resource kinds.
use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod, PodSpec, PodStatus, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};

/// An in-process fake Kubernetes API server serving pods (see the module docs).
pub struct FakeApiServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: Mutex<Option<JoinHandle<()>>>,
}

struct Shared {
    state: Mutex<ApiState>,
}

struct ApiState {
    /// The last resourceVersion given out.
    rv: u64,
    /// Versions at or below this are gone from history (410 for watches and continue tokens).
    compacted: u64,
    pods: BTreeMap<(String, String), Pod>,
    /// (resourceVersion, event type, object) of writes after `compacted`.
    history: Vec<(u64, &'static str, Pod)>,
    watches: Vec<Watch>,
    next_watch: u64,
    log: Vec<String>,
    dra_versions: Vec<String>,
    bookmark_interval: Duration,
}

struct Watch {
    id: u64,
    tx: mpsc::UnboundedSender<Bytes>,
    namespace: Option<String>,
    selector: Selector,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, ApiState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl ApiState {
    /// Record a write: history, and every matching watch.
    fn publish(&mut self, kind: &'static str, pod: &Pod) {
        self.history.push((self.rv, kind, pod.clone()));
        let line = event_line(kind, &object(pod));
        self.watches.retain(|w| !w.matches(pod) || w.tx.send(line.clone()).is_ok());
    }
}

impl Watch {
    fn matches(&self, pod: &Pod) -> bool {
        in_scope(self.namespace.as_deref(), &self.selector, pod)
    }
}

/// Whether a list or watch of `namespace` (all when `None`) with `selector` includes `pod`.
fn in_scope(namespace: Option<&str>, selector: &Selector, pod: &Pod) -> bool {
    namespace.is_none_or(|ns| pod.metadata.namespace.as_deref() == Some(ns)) && selector.matches(pod)
}

/// A parsed `fieldSelector`.
#[derive(Clone, Debug, Default)]
struct Selector(Vec<(String, String, bool)>);

impl Selector {
    fn parse(s: &str) -> Result<Self, String> {
        let mut terms = Vec::new();
        for term in s.split(',').filter(|t| !t.is_empty()) {
            let (field, value, negated) = if let Some((f, v)) = term.split_once("!=") {
                (f, v, true)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, v, false)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, v, false)
            } else {
                return Err(format!("invalid selector: '{s}'; can't understand '{term}'"));
            };
            if !matches!(field, "spec.nodeName" | "metadata.name" | "metadata.namespace") {
                return Err(format!("field label not supported: {field}"));
            }
            terms.push((field.to_string(), value.to_string(), negated));
        }
        Ok(Selector(terms))
    }

    fn matches(&self, pod: &Pod) -> bool {
        self.0.iter().all(|(field, value, negated)| {
            let actual = match field.as_str() {
                "spec.nodeName" => pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
                "metadata.name" => pod.metadata.name.as_deref(),
                _ => pod.metadata.namespace.as_deref(),
            }
            .unwrap_or("");
            (actual == value) != *negated
        })
    }
}

/// A pod as JSON with `apiVersion` and `kind` (watch events and gets carry them).
fn object(pod: &Pod) -> Value {
    let mut v = serde_json::to_value(pod).expect("a Pod serializes");
    v["apiVersion"] = json!("v1");
    v["kind"] = json!("Pod");
    v
}

fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({ "type": kind, "object": object })).expect("json");
    line.push(b'\n');
    Bytes::from(line)
}

fn bookmark(rv: u64, initial_events_end: bool) -> Bytes {
    let mut metadata = json!({ "resourceVersion": rv.to_string() });
    if initial_events_end {
        metadata["annotations"] = json!({ "k8s.io/initial-events-end": "true" });
    }
    event_line("BOOKMARK", &json!({ "apiVersion": "v1", "kind": "Pod", "metadata": metadata }))
}

fn status_object(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code,
    })
}

fn status_response(code: StatusCode, reason: &str, message: &str) -> Response {
    (code, Json(status_object(code.as_u16(), reason, message))).into_response()
}

async fn log_request(State(shared): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    shared.lock().log.push(req.uri().to_string());
    next.run(req).await
}

async fn all_pods(State(shared): State<Arc<Shared>>, Query(q): Query<HashMap<String, String>>) -> Response {
    list_or_watch(shared, None, q)
}

async fn namespaced_pods(
    State(shared): State<Arc<Shared>>,
    UrlPath(ns): UrlPath<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    list_or_watch(shared, Some(ns), q)
}

async fn get_pod(State(shared): State<Arc<Shared>>, UrlPath((ns, name)): UrlPath<(String, String)>) -> Response {
    match shared.lock().pods.get(&(ns, name.clone())) {
        Some(pod) => Json(object(pod)).into_response(),
        None => status_response(StatusCode::NOT_FOUND, "NotFound", &format!("pods \"{name}\" not found")),
    }
}

fn list_or_watch(shared: Arc<Shared>, namespace: Option<String>, q: HashMap<String, String>) -> Response {
    let selector = match Selector::parse(q.get("fieldSelector").map_or("", String::as_str)) {
        Ok(s) => s,
        Err(msg) => return status_response(StatusCode::BAD_REQUEST, "BadRequest", &msg),
    };
    if q.get("watch").is_some_and(|w| w == "true" || w == "1") {
        watch(shared, namespace, selector, &q)
    } else {
        list(&shared, namespace, selector, &q)
    }
}

fn list(shared: &Shared, namespace: Option<String>, selector: Selector, q: &HashMap<String, String>) -> Response {
    let st = shared.lock();
    let matching: Vec<&Pod> = st.pods.values().filter(|p| in_scope(namespace.as_deref(), &selector, p)).collect();
    let offset = match q.get("continue").filter(|c| !c.is_empty()) {
        None => 0,
        Some(token) => {
            let parsed = token.split_once(':').and_then(|(rv, off)| Some((rv.parse::<u64>().ok()?, off.parse().ok()?)));
            match parsed {
                Some((rv, _)) if rv < st.compacted => {
                    let msg = "The provided continue parameter is too old to display a consistent list result.";
                    return status_response(StatusCode::GONE, "Expired", msg);
                }
                Some((_, off)) => off,
                None => return status_response(StatusCode::BAD_REQUEST, "BadRequest", "invalid continue token"),
            }
        }
    };
    let limit = q.get("limit").and_then(|l| l.parse::<usize>().ok()).filter(|l| *l > 0).unwrap_or(usize::MAX);
    let page: Vec<Value> = matching
        .iter()
        .skip(offset)
        .take(limit)
        .map(|p| {
            // Real list items carry no apiVersion/kind.
            let mut v = serde_json::to_value(p).expect("a Pod serializes");
            if let Some(m) = v.as_object_mut() {
                m.remove("apiVersion");
                m.remove("kind");
            }
            v
        })
        .collect();
    let mut metadata = json!({ "resourceVersion": st.rv.to_string() });
    let next = offset + page.len();
    if next < matching.len() {
        metadata["continue"] = json!(format!("{}:{next}", st.rv));
        metadata["remainingItemCount"] = json!(matching.len() - next);
    }
    Json(json!({ "apiVersion": "v1", "kind": "PodList", "metadata": metadata, "items": page })).into_response()
}

fn watch(shared: Arc<Shared>, namespace: Option<String>, selector: Selector, q: &HashMap<String, String>) -> Response {
    let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
    let timeout = Duration::from_secs(q.get("timeoutSeconds").and_then(|t| t.parse().ok()).unwrap_or(1800));
    let requested = q.get("resourceVersion").map(String::as_str).unwrap_or("");
    let streaming = q.get("sendInitialEvents").is_some_and(|v| v == "true");
    {
        let mut st = shared.lock();
        let w = Watch { id: st.next_watch, tx, namespace, selector };
        st.next_watch += 1;
        if streaming || requested.is_empty() || requested == "0" {
            // Start from the current state: synthetic ADDED events.
            for pod in st.pods.values().filter(|p| w.matches(p)) {
                let _ = w.tx.send(event_line("ADDED", &object(pod)));
            }
            if streaming {
                let _ = w.tx.send(bookmark(st.rv, true));
            }
        } else {
            let Ok(from) = requested.parse::<u64>() else {
                return status_response(StatusCode::BAD_REQUEST, "BadRequest", "invalid resourceVersion");
            };
            if from < st.compacted {
                // A real server answers 200 and then an ERROR event with the Status.
                let msg = format!("too old resource version: {from} ({})", st.compacted);
                let line = event_line("ERROR", &status_object(410, "Expired", &msg));
                return ([(header::CONTENT_TYPE, "application/json")], Body::from(line)).into_response();
            }
            for (_, kind, pod) in st.history.iter().filter(|(rv, _, p)| *rv > from && w.matches(p)) {
                let _ = w.tx.send(event_line(kind, &object(pod)));
            }
        }
        let id = w.id;
        let interval = st.bookmark_interval;
        let bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
        st.watches.push(w);
        tokio::spawn(watch_ticker(shared.clone(), id, timeout, bookmarks.then_some(interval)));
    }
    let body =
        futures::stream::unfold(
            rx,
            |mut rx| async move { rx.recv().await.map(|line| (Ok::<_, Infallible>(line), rx)) },
        );
    ([(header::CONTENT_TYPE, "application/json")], Body::from_stream(body)).into_response()
}

/// Sends bookmarks (under the state lock, so a bookmark never overtakes an event) and ends the
/// watch after its timeout; a watch removed elsewhere (compaction, stop) ends the ticker.
async fn watch_ticker(shared: Arc<Shared>, id: u64, timeout: Duration, bookmarks: Option<Duration>) {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let wake = bookmarks.map_or(deadline, |b| (tokio::time::Instant::now() + b).min(deadline));
        tokio::time::sleep_until(wake).await;
        let mut st = shared.lock();
        let Some(pos) = st.watches.iter().position(|w| w.id == id) else { return };
        if tokio::time::Instant::now() >= deadline {
            st.watches.remove(pos);
            return;
        }
        let line = bookmark(st.rv, false);
        if st.watches[pos].tx.send(line).is_err() {
            st.watches.remove(pos);
            return;
        }
    }
}

async fn version() -> Json<Value> {
    Json(json!({
        "major": "1", "minor": "34", "gitVersion": "v1.34.0-fake", "gitCommit": "0", "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24", "compiler": "gc", "platform": "linux/amd64",
    }))
}

async fn core_versions() -> Json<Value> {
    Json(json!({ "kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [] }))
}

async fn api_groups(State(shared): State<Arc<Shared>>) -> Json<Value> {
    let group = |name: &str, versions: &[String]| {
        let vs: Vec<Value> =
            versions.iter().map(|v| json!({ "groupVersion": format!("{name}/{v}"), "version": v })).collect();
        json!({ "name": name, "versions": vs, "preferredVersion": vs[0] })
    };
    let mut groups = vec![group("apps", &["v1".to_string()])];
    let dra = shared.lock().dra_versions.clone();
    if !dra.is_empty() {
        groups.push(group("resource.k8s.io", &dra));
    }
    Json(json!({ "kind": "APIGroupList", "apiVersion": "v1", "groups": groups }))
}

async fn not_found(req: Request) -> Response {
    status_response(StatusCode::NOT_FOUND, "NotFound", &format!("the server could not find {}", req.uri()))
}

impl FakeApiServer {
    /// Start on `127.0.0.1:<random port>` with no pods. Must be called inside a tokio runtime.
    pub async fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            state: Mutex::new(ApiState {
                rv: 1,
                compacted: 0,
                pods: BTreeMap::new(),
                history: Vec::new(),
                watches: Vec::new(),
                next_watch: 1,
                log: Vec::new(),
                dra_versions: Vec::new(),
                bookmark_interval: Duration::from_millis(500),
            }),
        });
        let server = FakeApiServer { addr, shared, server: Mutex::new(None) };
        server.serve(listener);
        Ok(server)
    }

    fn serve(&self, listener: TcpListener) {
        let app = Router::new()
            .route("/version", get(version))
            .route("/api", get(core_versions))
            .route("/apis", get(api_groups))
            .route("/api/v1/pods", get(all_pods))
            .route("/api/v1/namespaces/{ns}/pods", get(namespaced_pods))
            .route("/api/v1/namespaces/{ns}/pods/{name}", get(get_pod))
            .fallback(not_found)
            .layer(axum::middleware::from_fn_with_state(self.shared.clone(), log_request))
            .with_state(self.shared.clone());
        // Our own accept loop (not `axum::serve`) so that stopping cuts every open connection,
        // watches included, the way an API server restart does.
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let service = TowerToHyperService::new(app.clone());
                connections.spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
                while connections.try_join_next().is_some() {}
            }
        });
        *self.server.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A `kube` client configuration for this server.
    pub fn client_config(&self) -> kube::Config {
        kube::Config::new(self.url().parse().expect("a valid URL"))
    }

    /// Write a kubeconfig pointing at this server (for `kubernetes.kubeconfig`, `$KUBECONFIG`, or
    /// an agent run as a subprocess).
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: default\n\
             current-context: fake\nusers:\n- name: fake\n  user: {{}}\n",
            self.url()
        );
        std::fs::write(path, text)
    }

    /// Create or replace a pod (keyed by namespace and name; namespace defaults to `default`):
    /// it gets the next resourceVersion, and watches see ADDED or MODIFIED. Returns it as stored.
    pub fn apply(&self, mut pod: Pod) -> Pod {
        let mut st = self.shared.lock();
        st.rv += 1;
        let ns = pod.metadata.namespace.get_or_insert_with(|| "default".into()).clone();
        let name = pod.metadata.name.clone().expect("a pod needs metadata.name");
        pod.metadata.resource_version = Some(st.rv.to_string());
        let old = st.pods.get(&(ns.clone(), name.clone()));
        if pod.metadata.uid.is_none() {
            pod.metadata.uid = Some(old.and_then(|p| p.metadata.uid.clone()).unwrap_or_else(random_uid));
        }
        let kind = if old.is_some() { "MODIFIED" } else { "ADDED" };
        st.pods.insert((ns, name), pod.clone());
        st.publish(kind, &pod);
        pod
    }

    /// Delete a pod; watches see DELETED. Returns it, or `None` when there was none.
    pub fn delete(&self, namespace: &str, name: &str) -> Option<Pod> {
        let mut st = self.shared.lock();
        let mut pod = st.pods.remove(&(namespace.to_string(), name.to_string()))?;
        st.rv += 1;
        pod.metadata.resource_version = Some(st.rv.to_string());
        st.publish("DELETED", &pod);
        Some(pod)
    }

    /// A stored pod.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Pod> {
        self.shared.lock().pods.get(&(namespace.to_string(), name.to_string())).cloned()
    }

    /// Forget all history and end every watch, as etcd compaction plus a watch-cache reset do:
    /// a client resuming from any version it has seen gets `410 Gone` and has to relist.
    pub fn compact_and_drop_watches(&self) {
        let mut st = self.shared.lock();
        // The cluster moved on: even the newest version a client saw is now older than the
        // compaction point.
        st.rv += 1;
        st.compacted = st.rv;
        st.history.clear();
        st.watches.clear();
    }

    /// Stop serving: the port closes and every open connection (watches included) is cut. Data
    /// stays; [`FakeApiServer::restart`] brings the server back.
    pub async fn stop(&self) {
        let task = self.server.lock().unwrap_or_else(|e| e.into_inner()).take();
        self.shared.lock().watches.clear();
        if let Some(task) = task {
            task.abort();
            let _ = task.await;
        }
    }

    /// Serve again on the same port, with the same pods and history.
    pub async fn restart(&self) -> std::io::Result<()> {
        self.stop().await;
        let listener = TcpListener::bind(self.addr).await?;
        self.serve(listener);
        Ok(())
    }

    /// The URIs (path and query) of every request so far, in order.
    pub fn requests(&self) -> Vec<String> {
        self.shared.lock().log.clone()
    }

    /// Open watches.
    pub fn watch_count(&self) -> usize {
        self.shared.lock().watches.len()
    }

    /// The `resource.k8s.io` versions `/apis` lists (none by default: DRA not served).
    pub fn set_dra_versions(&self, versions: &[&str]) {
        self.shared.lock().dra_versions = versions.iter().map(|v| v.to_string()).collect();
    }

    /// How often open watches get a BOOKMARK (500 ms by default; a real server: about a minute).
    pub fn set_bookmark_interval(&self, interval: Duration) {
        self.shared.lock().bookmark_interval = interval;
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        if let Some(task) = self.server.get_mut().unwrap_or_else(|e| e.into_inner()).take() {
            task.abort();
        }
    }
}

fn random_uid() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/uuid").map(|s| s.trim().to_string()).unwrap_or_else(|_| {
        let n = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        format!("{:08x}-0000-4000-8000-{:012x}", (n >> 48) as u32, n as u64 & 0xffff_ffff_ffff)
    })
}

/// Builds the pods tests put into a [`FakeApiServer`].
#[derive(Clone, Debug)]
pub struct FakePod {
    pod: Pod,
}

impl FakePod {
    /// A pod `namespace/name` bound to `node`, with a random UID and no containers.
    pub fn new(namespace: &str, name: &str, node: &str) -> Self {
        FakePod {
            pod: Pod {
                metadata: ObjectMeta {
                    namespace: Some(namespace.into()),
                    name: Some(name.into()),
                    uid: Some(random_uid()),
                    ..ObjectMeta::default()
                },
                spec: Some(PodSpec { node_name: Some(node.into()), ..PodSpec::default() }),
                status: Some(PodStatus { phase: Some("Running".into()), ..PodStatus::default() }),
            },
        }
    }

    /// Set the UID.
    pub fn uid(mut self, uid: &str) -> Self {
        self.pod.metadata.uid = Some(uid.into());
        self
    }

    /// Add a label.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.pod.metadata.labels.get_or_insert_with(BTreeMap::new).insert(key.into(), value.into());
        self
    }

    /// Add an annotation.
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.pod.metadata.annotations.get_or_insert_with(BTreeMap::new).insert(key.into(), value.into());
        self
    }

    /// Set the controlling owner reference.
    pub fn owner(mut self, kind: &str, name: &str) -> Self {
        self.pod.metadata.owner_references = Some(vec![OwnerReference {
            api_version: if kind == "Job" { "batch/v1" } else { "apps/v1" }.into(),
            kind: kind.into(),
            name: name.into(),
            uid: random_uid(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]);
        self
    }

    /// Add a container with `gpus` × `nvidia.com/gpu` in its limits (none when 0) and, when given,
    /// a running status with this runtime-prefixed container id (`containerd://<64 hex>`).
    pub fn container(mut self, name: &str, gpus: u64, container_id: Option<&str>) -> Self {
        let resources = (gpus > 0).then(|| ResourceRequirements {
            limits: Some([("nvidia.com/gpu".to_string(), Quantity(gpus.to_string()))].into()),
            ..ResourceRequirements::default()
        });
        let spec = self.pod.spec.get_or_insert_with(PodSpec::default);
        spec.containers.push(Container {
            name: name.into(),
            image: Some("busybox".into()),
            resources,
            ..Container::default()
        });
        if let Some(id) = container_id {
            let status = self.pod.status.get_or_insert_with(PodStatus::default);
            status.container_statuses.get_or_insert_with(Vec::new).push(ContainerStatus {
                name: name.into(),
                container_id: Some(id.into()),
                image: "busybox".into(),
                image_id: String::new(),
                ready: true,
                restart_count: 0,
                ..ContainerStatus::default()
            });
        }
        self
    }

    /// The pod.
    pub fn build(self) -> Pod {
        self.pod
    }
}
