//! Pod metadata for this node: a `kube` watcher on the pods with `spec.nodeName=<node>`, feeding a
//! reflector store, running as a tokio task; lookups by pod UID, container id or cgroup path.
//!
//! The watcher survives what API servers do: paged initial lists, relists after `410 Gone`
//! (expired resource versions), and the server going away and coming back (exponential backoff,
//! client-go's parameters). The store keeps answering from its last contents meanwhile; a relist
//! replaces them atomically when it completes. [`PodCache::status`] says where it stands.
//!
//! Starting it ([`PodWatcher::start`]) follows [`SourceMode`]: `off` does nothing; `auto` on a
//! host with no kubeconfig and no in-cluster environment says "Kubernetes not in use" and the
//! agent keeps going; `required` turns every missing piece into an error naming the fix.
//!
//! Dynamic Resource Allocation: the API groups the server offers are discovered once connected,
//! and [`KubeStatus::dra_versions`] lists the `resource.k8s.io` versions it serves, against the
//! ones this build understands ([`DRA_VERSIONS_SUPPORTED`]).
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Container, Pod};
use kube::Client;
use kube::api::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};

use tracer_core::config::{KubeSettings, SourceMode};
use tracer_core::identity::KubeStatus;
use tracer_core::identity::{
    PodIdentity, PodLookup,
    cgroup::{CgroupIdentity, parse_cgroup_path},
};

/// `resource.k8s.io` versions this build can decode (k8s-openapi's `v1_34` API set), preferred first.
pub(crate) const DRA_VERSIONS_SUPPORTED: &[&str] = &["v1", "v1beta2", "v1beta1"];

/// The label the ReplicaSet controller stamps on its pods; the ReplicaSet is `<deployment>-<hash>`.
const POD_TEMPLATE_HASH: &str = "pod-template-hash";

/// Errors starting the pod watcher. Each names its cause and the fix.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// Required mode, but nothing says where an API server is.
    #[error(
        "Kubernetes is required (kubernetes.mode = \"required\") but no API server is configured: {checked}. \
         Fix: run the agent in a pod with a service account (in-cluster config), set kubernetes.kubeconfig or \
         $KUBECONFIG, or set kubernetes.mode = \"auto\" to run without pod identity"
    )]
    NotConfigured {
        /// What was looked at.
        checked: String,
    },
    /// The configured kubeconfig cannot be loaded.
    #[error(
        "cannot load kubeconfig {path}: {source}. Fix: point kubernetes.kubeconfig at a readable, valid kubeconfig"
    )]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// Neither `$KUBECONFIG` / `~/.kube/config` nor the in-cluster environment gave a configuration.
    #[error(
        "cannot build the Kubernetes client configuration: {source}. Fix: check $KUBECONFIG / ~/.kube/config, or \
         the service account mount at /var/run/secrets/kubernetes.io/serviceaccount"
    )]
    Infer {
        /// Why.
        #[source]
        source: kube::config::InferConfigError,
    },
    /// The client could not be built from the configuration (TLS material, auth plugin).
    #[error(
        "cannot create the Kubernetes client for {server}: {source}. Fix: check the kubeconfig's cluster and user entries"
    )]
    Client {
        /// The API server URL.
        server: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// No node name in the settings, `$NODE_NAME`, or the hostname.
    #[error(
        "cannot tell this node's name. Fix: set kubernetes.node_name, or $NODE_NAME from the pod's spec.nodeName \
         (downward API)"
    )]
    NodeName,
    /// Required mode, and the first list did not complete in time.
    #[error(
        "the Kubernetes API server {server} did not list node {node}'s pods within {timeout:?}: {last_error}. Fix: \
         check that the API server is reachable from this node and that the agent's service account may list and \
         watch pods"
    )]
    NotReady {
        /// The API server URL.
        server: String,
        /// The node.
        node: String,
        /// How long was waited.
        timeout: Duration,
        /// The watcher's last error, or "no answer yet".
        last_error: String,
    },
}

impl KubeError {
    /// A short, stable reason for a metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            KubeError::NotConfigured { .. } => "not_configured",
            KubeError::Kubeconfig { .. } => "kubeconfig",
            KubeError::Infer { .. } => "infer_config",
            KubeError::Client { .. } => "client",
            KubeError::NodeName => "node_name",
            KubeError::NotReady { .. } => "not_ready",
        }
    }
}

/// The parts of the process environment that decide whether and how Kubernetes is used; separate so
/// tests can describe a host without touching the process environment.
#[derive(Clone, Debug, Default)]
pub struct KubeEnv {
    /// `$KUBECONFIG` (a `:`-separated list of files).
    pub kubeconfig_var: Option<OsString>,
    /// `$HOME`, for `~/.kube/config`.
    pub home: Option<PathBuf>,
    /// `$KUBERNETES_SERVICE_HOST` is set: running in a pod.
    pub in_cluster: bool,
    /// `$NODE_NAME`.
    pub node_name_var: Option<String>,
    /// The host name.
    pub hostname: Option<String>,
}

impl KubeEnv {
    /// Read this process's environment and host name.
    pub(crate) fn from_process() -> Self {
        let nonempty = |v: Option<OsString>| v.filter(|v| !v.is_empty());
        Self {
            kubeconfig_var: nonempty(std::env::var_os("KUBECONFIG")),
            home: nonempty(std::env::var_os("HOME")).map(PathBuf::from),
            in_cluster: nonempty(std::env::var_os("KUBERNETES_SERVICE_HOST")).is_some(),
            node_name_var: std::env::var("NODE_NAME").ok().filter(|v| !v.is_empty()),
            hostname: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
                .filter(|h| !h.is_empty()),
        }
    }

    /// Whatever says where an API server is, in kube's order; `Err` describes what was looked at.
    fn config_source(&self, settings: &KubeSettings) -> Result<ConfigSource, String> {
        if let Some(p) = &settings.kubeconfig {
            return Ok(ConfigSource::File(p.clone()));
        }
        let var_files: Vec<PathBuf> =
            self.kubeconfig_var.as_ref().map(|v| std::env::split_paths(v).collect()).unwrap_or_default();
        let home_file = self.home.as_ref().map(|h| h.join(".kube/config"));
        if var_files.iter().any(|p| p.is_file())
            || (var_files.is_empty() && home_file.as_ref().is_some_and(|p| p.is_file()))
        {
            return Ok(ConfigSource::Infer);
        }
        if self.in_cluster {
            return Ok(ConfigSource::Infer);
        }
        let kubeconfig = match (&self.kubeconfig_var, &home_file) {
            (Some(v), _) => format!("no file named by $KUBECONFIG ({}) exists", v.to_string_lossy()),
            (None, Some(h)) => format!("$KUBECONFIG is unset and {} does not exist", h.display()),
            (None, None) => "$KUBECONFIG and $HOME are unset".to_string(),
        };
        Err(format!(
            "kubernetes.kubeconfig is unset, {kubeconfig}, and this is not a pod ($KUBERNETES_SERVICE_HOST is unset)"
        ))
    }
}

enum ConfigSource {
    File(PathBuf),
    Infer,
}

/// Tuning of the watcher; the defaults suit a node agent.
#[derive(Clone, Debug)]
pub struct WatchOptions {
    /// Pods per page of a list.
    pub page_size: u32,
    /// How often a disconnected watcher asks the server whether it is back.
    pub probe_interval: Duration,
    /// In required mode, how long [`PodWatcher::start`] waits for the first complete list.
    pub ready_timeout: Duration,
}

impl Default for WatchOptions {
    fn default() -> Self {
        Self { page_size: 500, probe_interval: Duration::from_secs(2), ready_timeout: Duration::from_secs(15) }
    }
}

/// What [`PodWatcher::start`] did.
#[derive(Debug)]
pub enum KubeStart {
    /// `kubernetes.mode = "off"`.
    Off,
    /// Auto mode on a host with no kubeconfig and no in-cluster environment.
    NotInUse {
        /// What was looked at.
        reason: String,
    },
    /// Auto mode: configured, but the client could not be set up; the agent runs without pods.
    Unavailable {
        /// Why.
        error: KubeError,
    },
    /// The watcher runs; look pods up through [`PodWatcher::cache`].
    Running(PodWatcher),
}

impl KubeStart {
    /// The cache, when the watcher runs.
    pub fn cache(&self) -> Option<PodCache> {
        match self {
            KubeStart::Running(w) => Some(w.cache()),
            _ => None,
        }
    }

    /// One line for the log.
    pub fn describe(&self) -> String {
        match self {
            KubeStart::Off => "Kubernetes identity off (kubernetes.mode = \"off\")".into(),
            KubeStart::NotInUse { reason } => format!("Kubernetes not in use: {reason}"),
            KubeStart::Unavailable { error } => format!("Kubernetes identity unavailable: {error}"),
            KubeStart::Running(w) => {
                let s = w.cache().status();
                format!("watching the pods of node {} on {}", s.node, s.server)
            }
        }
    }
}

/// The running watcher task; dropping it stops the task. Lookups go through [`PodWatcher::cache`].
#[derive(Debug)]
pub struct PodWatcher {
    cache: PodCache,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for PodWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl PodWatcher {
    /// Start per `settings.mode`, from this process's environment. Must be called inside a tokio
    /// runtime (either flavour): the watcher is spawned on it, and makes progress whenever the
    /// runtime runs tasks.
    pub async fn start(settings: &KubeSettings) -> Result<KubeStart, KubeError> {
        Self::start_with(settings, &KubeEnv::from_process(), WatchOptions::default()).await
    }

    /// [`PodWatcher::start`] with an explicit environment and options.
    pub async fn start_with(
        settings: &KubeSettings,
        env: &KubeEnv,
        options: WatchOptions,
    ) -> Result<KubeStart, KubeError> {
        let required = match settings.mode {
            SourceMode::Off => return Ok(KubeStart::Off),
            SourceMode::Auto => false,
            SourceMode::Required => true,
        };
        let source = match env.config_source(settings) {
            Ok(s) => s,
            Err(checked) if required => return Err(KubeError::NotConfigured { checked }),
            Err(reason) => return Ok(KubeStart::NotInUse { reason }),
        };
        let client = match Self::client(settings, env, source).await {
            Ok(c) => c,
            Err(e) if required => return Err(e),
            Err(error) => return Ok(KubeStart::Unavailable { error }),
        };
        let (node, client, server) = client;
        let watcher = Self::spawn(client, node, server, settings, options.clone());
        if required && !watcher.cache.wait_ready(options.ready_timeout).await {
            let s = watcher.cache.status();
            return Err(KubeError::NotReady {
                server: s.server,
                node: s.node,
                timeout: options.ready_timeout,
                last_error: s.last_error.unwrap_or_else(|| "no answer yet".into()),
            });
        }
        Ok(KubeStart::Running(watcher))
    }

    async fn client(
        settings: &KubeSettings,
        env: &KubeEnv,
        source: ConfigSource,
    ) -> Result<(String, Client, String), KubeError> {
        let node = settings
            .node_name
            .clone()
            .or_else(|| env.node_name_var.clone())
            .or_else(|| env.hostname.clone())
            .ok_or(KubeError::NodeName)?;
        let config = match source {
            ConfigSource::File(path) => {
                let kc = Kubeconfig::read_from(&path)
                    .map_err(|source| KubeError::Kubeconfig { path: path.clone(), source })?;
                kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                    .await
                    .map_err(|source| KubeError::Kubeconfig { path, source })?
            }
            ConfigSource::Infer => kube::Config::infer().await.map_err(|source| KubeError::Infer { source })?,
        };
        let server = config.cluster_url.to_string();
        let client = Client::try_from(config).map_err(|source| KubeError::Client { server: server.clone(), source })?;
        Ok((node, client, server))
    }

    /// Start watching `node`'s pods with an already built client (tests, or a caller with its own
    /// client). Must be called inside a tokio runtime.
    pub fn spawn(client: Client, node: String, server: String, settings: &KubeSettings, options: WatchOptions) -> Self {
        let (store, writer) = reflector::store::<Pod>();
        let (ready, _) = tokio::sync::watch::channel(false);
        let shared = Arc::new(Shared {
            store,
            index: RwLock::new(Index::default()),
            status: Mutex::new(KubeStatus { node: node.clone(), server, ..KubeStatus::default() }),
            ready,
            label_allow_list: settings.label_allow_list.clone(),
            gpu_resource_names: settings.gpu_resource_names.clone(),
        });
        let task = tokio::spawn(run(client, node, writer, shared.clone(), options));
        PodWatcher { cache: PodCache { shared }, task }
    }

    /// A handle for lookups (cheap to clone; usable from any thread).
    pub fn cache(&self) -> PodCache {
        self.cache.clone()
    }
}

/// Lookups into the pod cache. Cheap to clone; all methods are synchronous and never block on the
/// network.
#[derive(Clone)]
pub struct PodCache {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for PodCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodCache").field("status", &self.status()).finish()
    }
}

struct Shared {
    store: Store<Pod>,
    index: RwLock<Index>,
    status: Mutex<KubeStatus>,
    ready: tokio::sync::watch::Sender<bool>,
    label_allow_list: Vec<String>,
    gpu_resource_names: Vec<String>,
}

/// Secondary keys into the store: pod UID and container id. Rebuilt from the store after every
/// complete list, so it never outlives the pods it names.
#[derive(Default)]
struct Index {
    by_uid: HashMap<String, ObjectRef<Pod>>,
    /// Container id → (pod UID, container name).
    containers: HashMap<String, (String, String)>,
    containers_of: HashMap<String, Vec<String>>,
}

impl Index {
    fn insert(&mut self, pod: &Pod) {
        let Some(uid) = pod.metadata.uid.clone() else { return };
        self.remove(&uid);
        let mut ids = Vec::new();
        if let Some(st) = &pod.status {
            let all = [&st.init_container_statuses, &st.container_statuses, &st.ephemeral_container_statuses];
            for cs in all.into_iter().flatten().flatten() {
                if let Some(id) = cs.container_id.as_deref().and_then(strip_runtime_prefix) {
                    self.containers.insert(id.clone(), (uid.clone(), cs.name.clone()));
                    ids.push(id);
                }
            }
        }
        self.containers_of.insert(uid.clone(), ids);
        self.by_uid.insert(uid, ObjectRef::from_obj(pod));
    }

    fn remove(&mut self, uid: &str) {
        self.by_uid.remove(uid);
        for id in self.containers_of.remove(uid).unwrap_or_default() {
            self.containers.remove(&id);
        }
    }
}

/// `containerd://<id>`, `cri-o://<id>`, `docker://<id>` → `<id>` (lower case); `None` when empty.
fn strip_runtime_prefix(s: &str) -> Option<String> {
    let id = s.split_once("://").map_or(s, |(_, id)| id).trim();
    (!id.is_empty()).then(|| id.to_ascii_lowercase())
}

impl PodLookup for PodCache {
    fn by_cgroup(&self, cgroup: &CgroupIdentity) -> Option<PodIdentity> {
        PodCache::by_cgroup(self, cgroup)
    }
}

impl PodCache {
    /// The pod with this UID (no container named).
    pub fn by_pod_uid(&self, uid: &str) -> Option<PodIdentity> {
        let key = self.shared.index.read().unwrap_or_else(|e| e.into_inner()).by_uid.get(uid).cloned()?;
        let pod = self.shared.store.get(&key)?;
        Some(self.identity(&pod, None))
    }

    /// The pod running this container, and the container's name. Accepts a bare id or the
    /// `containerd://…` form of pod status.
    pub fn by_container_id(&self, container_id: &str) -> Option<PodIdentity> {
        let id = strip_runtime_prefix(container_id)?;
        let (uid, name) = self.shared.index.read().unwrap_or_else(|e| e.into_inner()).containers.get(&id).cloned()?;
        let mut identity = self.by_pod_uid(&uid)?;
        identity.container_name = Some(name);
        Some(identity)
    }

    /// The pod (and container, when known) a parsed cgroup belongs to: by container id first, then
    /// by pod UID (a sandbox, or a container the pod status does not list yet).
    pub fn by_cgroup(&self, cgroup: &CgroupIdentity) -> Option<PodIdentity> {
        cgroup
            .container_id
            .as_deref()
            .and_then(|id| self.by_container_id(id))
            .or_else(|| cgroup.pod_uid.as_deref().and_then(|uid| self.by_pod_uid(uid)))
    }

    /// [`PodCache::by_cgroup`] of [`parse_cgroup_path`]`(path)`.
    pub fn by_cgroup_path(&self, path: &str) -> Option<PodIdentity> {
        self.by_cgroup(&parse_cgroup_path(path))
    }

    /// Every cached pod.
    pub fn pods(&self) -> Vec<PodIdentity> {
        self.shared.store.state().iter().map(|p| self.identity(p, None)).collect()
    }

    /// Where the watcher stands.
    pub fn status(&self) -> KubeStatus {
        let mut s = self.shared.status.lock().unwrap_or_else(|e| e.into_inner()).clone();
        s.pods_cached = self.shared.store.len();
        s
    }

    /// Wait until the first complete list has arrived; `false` on timeout.
    pub async fn wait_ready(&self, timeout: Duration) -> bool {
        let mut rx = self.shared.ready.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|r| *r)).await.is_ok_and(|r| r.is_ok())
    }

    fn identity(&self, pod: &Pod, container_name: Option<String>) -> PodIdentity {
        let meta = &pod.metadata;
        let all_labels = meta.labels.clone().unwrap_or_default();
        let labels = self
            .shared
            .label_allow_list
            .iter()
            .filter_map(|k| all_labels.get(k).map(|v| (k.clone(), v.clone())))
            .collect();
        let (owner_kind, owner_name) = owner(pod).unzip();
        let mut gpu_requests = BTreeMap::new();
        if let Some(spec) = &pod.spec {
            let containers = spec.init_containers.iter().flatten().chain(spec.containers.iter());
            for c in containers {
                let gpus = gpu_counts(c, &self.shared.gpu_resource_names);
                if !gpus.is_empty() {
                    gpu_requests.insert(c.name.clone(), gpus);
                }
            }
        }
        PodIdentity {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            container_name,
            owner_kind,
            owner_name,
            labels,
            gpu_requests,
            node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        }
    }
}

/// GPU resource name → count, from limits (else requests). Extended resources are whole numbers;
/// anything else is not a GPU count and is left out.
fn gpu_counts(c: &Container, names: &[String]) -> BTreeMap<String, u64> {
    let Some(res) = &c.resources else { return BTreeMap::new() };
    names
        .iter()
        .filter_map(|name| {
            let q = res.limits.as_ref().and_then(|l| l.get(name)).or_else(|| res.requests.as_ref()?.get(name))?;
            let n = q.0.trim().parse::<u64>().ok().filter(|n| *n > 0)?;
            Some((name.clone(), n))
        })
        .collect()
}

/// The workload behind a pod: the controlling owner (else the first), with ReplicaSet → Deployment
/// (the ReplicaSet is named `<deployment>-<pod-template-hash>`) and Job → CronJob (a CronJob's Job
/// is named `<cronjob>-<scheduled minute since the epoch>`).
fn owner(pod: &Pod) -> Option<(String, String)> {
    let refs = pod.metadata.owner_references.as_deref().unwrap_or_default();
    let r = refs.iter().find(|r| r.controller == Some(true)).or(refs.first())?;
    let labels = pod.metadata.labels.as_ref();
    match r.kind.as_str() {
        "ReplicaSet" => {
            let hash = labels.and_then(|l| l.get(POD_TEMPLATE_HASH));
            if let Some(base) = hash.and_then(|h| r.name.strip_suffix(h.as_str())?.strip_suffix('-'))
                && !base.is_empty()
            {
                return Some(("Deployment".into(), base.into()));
            }
        }
        "Job" => {
            if let Some((base, minutes)) = r.name.rsplit_once('-') {
                // Minutes since the epoch between 2019 and 2099: 8 digits, so `train-20240101`
                // (a date, 20.2 M) is not mistaken for a schedule.
                let scheduled = minutes.len() == 8
                    && minutes.bytes().all(|b| b.is_ascii_digit())
                    && minutes.parse::<u64>().is_ok_and(|m| (25_000_000..=68_000_000).contains(&m));
                if scheduled && !base.is_empty() {
                    return Some(("CronJob".into(), base.into()));
                }
            }
        }
        _ => {}
    }
    Some((r.kind.clone(), r.name.clone()))
}

/// An error and its causes, on one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let text = c.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cur = c.source();
    }
    s
}

impl Shared {
    fn status(&self) -> std::sync::MutexGuard<'_, KubeStatus> {
        self.status.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn on_event(&self, event: &watcher::Event<Pod>) {
        let mut index = self.index.write().unwrap_or_else(|e| e.into_inner());
        match event {
            watcher::Event::Init => {
                let mut s = self.status();
                if s.ready {
                    s.relists += 1;
                }
            }
            // The store buffers a list until it is complete; the index follows it then.
            watcher::Event::InitApply(_) => {}
            watcher::Event::InitDone => {
                *index = Index::default();
                for pod in self.store.state() {
                    index.insert(&pod);
                }
                self.status().ready = true;
                self.ready.send_replace(true);
            }
            watcher::Event::Apply(pod) => index.insert(pod),
            watcher::Event::Delete(pod) => {
                if let Some(uid) = &pod.metadata.uid {
                    index.remove(uid);
                }
            }
        }
        self.status().connected = true;
    }

    fn on_error(&self, e: &watcher::Error) {
        let mut s = self.status();
        s.connected = false;
        s.errors += 1;
        s.last_error = Some(error_chain(e));
    }
}

/// Drop what lookups never read, so a node's pods cost little memory.
fn slim(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
    pod.metadata.annotations = None;
    if let Some(st) = &mut pod.status {
        st.conditions = None;
        st.message = None;
    }
}

async fn run(
    client: Client,
    node: String,
    writer: reflector::store::Writer<Pod>,
    shared: Arc<Shared>,
    options: WatchOptions,
) {
    let api: Api<Pod> = Api::all(client.clone());
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}")).page_size(options.page_size);
    let events = watcher(api, config).modify(slim).default_backoff().reflect(writer);
    let mut events = std::pin::pin!(events);
    let mut probe = tokio::time::interval(options.probe_interval);
    probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let (connected, discovered) = {
            let s = shared.status();
            (s.connected, s.dra_versions.is_some())
        };
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(event)) => shared.on_event(&event),
                Some(Err(e)) => {
                    tracing::debug!(error = %error_chain(&e), "pod watcher");
                    shared.on_error(&e);
                }
                None => break,
            },
            // The watcher reports nothing while a resumed watch is quiet: ask the server directly
            // whether it is back, and discover its API groups once it is.
            _ = probe.tick(), if !connected || !discovered => {
                if !connected && client.apiserver_version().await.is_ok() {
                    shared.status().connected = true;
                }
                if !discovered && let Ok(groups) = client.list_api_groups().await {
                    let versions = groups
                        .groups
                        .iter()
                        .filter(|g| g.name == "resource.k8s.io")
                        .flat_map(|g| g.versions.iter().map(|v| v.version.clone()))
                        .collect::<Vec<_>>();
                    tracing::info!(served = ?versions, supported = ?DRA_VERSIONS_SUPPORTED, "resource.k8s.io (DRA)");
                    shared.status().dra_versions = Some(versions);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
