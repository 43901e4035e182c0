//! A kubelet pod-resources double: the real `v1.PodResourcesLister` gRPC service (generated from
//! `proto/podresources/v1/api.proto`) served by tonic on a Unix socket in a temp dir, answering
//! what the test sets. Like the kubelet, `Get` of an unknown pod is gRPC `Unknown`
//! ("pod X in namespace Y not found"), not `NotFound`.
//!
//! It can be stopped (the socket disappears, as when the kubelet restarts) and restarted on the
//! same path with the same answers.
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use gpu_tracer_proto::podresources::v1 as api;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::{Request, Response, Status};

use crate::harness::{HarnessError, Result, fresh_temp_dir};

/// How many calls of each method the double answered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodResourcesCalls {
    pub list: u64,
    pub allocatable: u64,
    pub get: u64,
}

#[derive(Default)]
struct Answers {
    pods: Vec<api::PodResources>,
    allocatable: api::AllocatableResourcesResponse,
}

#[derive(Default)]
struct Counters {
    list: AtomicU64,
    allocatable: AtomicU64,
    get: AtomicU64,
}

#[derive(Clone)]
struct Service {
    answers: Arc<Mutex<Answers>>,
    counters: Arc<Counters>,
}

impl Service {
    fn answers(&self) -> std::sync::MutexGuard<'_, Answers> {
        self.answers.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[tonic::async_trait]
impl api::pod_resources_lister_server::PodResourcesLister for Service {
    async fn list(
        &self,
        _: Request<api::ListPodResourcesRequest>,
    ) -> std::result::Result<Response<api::ListPodResourcesResponse>, Status> {
        self.counters.list.fetch_add(1, Ordering::Relaxed);
        Ok(Response::new(api::ListPodResourcesResponse { pod_resources: self.answers().pods.clone() }))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<api::AllocatableResourcesRequest>,
    ) -> std::result::Result<Response<api::AllocatableResourcesResponse>, Status> {
        self.counters.allocatable.fetch_add(1, Ordering::Relaxed);
        Ok(Response::new(self.answers().allocatable.clone()))
    }

    async fn get(
        &self,
        request: Request<api::GetPodResourcesRequest>,
    ) -> std::result::Result<Response<api::GetPodResourcesResponse>, Status> {
        self.counters.get.fetch_add(1, Ordering::Relaxed);
        let r = request.into_inner();
        let found =
            self.answers().pods.iter().find(|p| p.name == r.pod_name && p.namespace == r.pod_namespace).cloned();
        match found {
            Some(pod) => Ok(Response::new(api::GetPodResourcesResponse { pod_resources: Some(pod) })),
            // The kubelet returns a plain Go error, which gRPC delivers as Unknown.
            None => Err(Status::unknown(format!("pod {} in namespace {} not found", r.pod_name, r.pod_namespace))),
        }
    }
}

struct Running {
    shutdown: oneshot::Sender<()>,
    task: JoinHandle<std::result::Result<(), tonic::transport::Error>>,
}

/// The double. Dropping it stops the server and removes its temp dir.
pub struct FakePodResources {
    dir: PathBuf,
    socket: PathBuf,
    service: Service,
    running: Option<Running>,
}

impl FakePodResources {
    /// Serve on `<fresh temp dir>/kubelet.sock`, answering no pods until told otherwise. Needs a
    /// tokio runtime.
    pub async fn start() -> Result<Self> {
        let dir = fresh_temp_dir("gpu-tracer-pod-resources")?;
        let socket = dir.join("kubelet.sock");
        let service = Service { answers: Arc::default(), counters: Arc::default() };
        let mut fake = FakePodResources { dir, socket, service, running: None };
        fake.restart().await?;
        Ok(fake)
    }

    /// The socket path (what `KubeSettings::pod_resources_socket` should be).
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The pods (and their containers' resources) `List` and `Get` answer from now on.
    pub fn set_pods(&self, pods: Vec<api::PodResources>) {
        self.service.answers().pods = pods;
    }

    /// What `GetAllocatableResources` answers from now on.
    pub fn set_allocatable(&self, allocatable: api::AllocatableResourcesResponse) {
        self.service.answers().allocatable = allocatable;
    }

    /// Calls answered so far.
    pub fn calls(&self) -> PodResourcesCalls {
        let c = &self.service.counters;
        PodResourcesCalls {
            list: c.list.load(Ordering::Relaxed),
            allocatable: c.allocatable.load(Ordering::Relaxed),
            get: c.get.load(Ordering::Relaxed),
        }
    }

    /// Whether it is serving.
    pub fn is_running(&self) -> bool {
        self.running.is_some()
    }

    /// Stop serving and remove the socket (as when the kubelet goes down). Open connections are
    /// closed.
    pub async fn stop(&mut self) -> Result<()> {
        if let Some(r) = self.running.take() {
            let _ = r.shutdown.send(());
            let mut task = r.task;
            if tokio::time::timeout(Duration::from_secs(5), &mut task).await.is_err() {
                task.abort();
            }
        }
        match std::fs::remove_file(&self.socket) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(HarnessError::io(format!("rm {}", self.socket.display()), e))
            }
            _ => Ok(()),
        }
    }

    /// Serve again on the same socket path, with the same answers.
    pub async fn restart(&mut self) -> Result<()> {
        self.stop().await?;
        let listener = tokio::net::UnixListener::bind(&self.socket)
            .map_err(|e| HarnessError::io(format!("bind {}", self.socket.display()), e))?;
        let (shutdown, signal) = oneshot::channel::<()>();
        let server = api::pod_resources_lister_server::PodResourcesListerServer::new(self.service.clone());
        let task = tokio::spawn(tonic::transport::Server::builder().add_service(server).serve_with_incoming_shutdown(
            tokio_stream::wrappers::UnixListenerStream::new(listener),
            async {
                let _ = signal.await;
            },
        ));
        self.running = Some(Running { shutdown, task });
        Ok(())
    }
}

impl Drop for FakePodResources {
    fn drop(&mut self) {
        if let Some(r) = self.running.take() {
            let _ = r.shutdown.send(());
            r.task.abort();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
