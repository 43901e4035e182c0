//! A gRPC client for the kubelet's `v1.PodResourcesLister` on its Unix socket
//! (`/var/lib/kubelet/pod-resources/kubelet.sock`). The messages and the client are generated from
//! `proto/podresources/v1/api.proto` (crate `gpu-tracer-proto`, feature `kubelet`).
use std::path::{Path, PathBuf};
use std::time::Duration;

use gpu_tracer_proto::podresources::v1 as api;
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint};

use api::pod_resources_lister_client::PodResourcesListerClient;

/// Largest answer accepted. tonic's default (4 MiB) is too small for a big node: every pod's CPU
/// ids and devices are in one `List` answer.
pub(crate) const MAX_DECODING_MESSAGE_BYTES: usize = 64 << 20;

/// How long one call may take before it is abandoned (the kubelet answers from memory).
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Errors talking to the kubelet pod-resources API.
#[derive(Debug, thiserror::Error)]
pub enum PodResourcesError {
    /// Nothing at the socket path.
    #[error(
        "kubelet pod-resources not available at {path}: the socket does not exist; mount the host's \
         /var/lib/kubelet/pod-resources into the agent (read-only hostPath) or set \
         kubernetes.pod_resources_socket to where the kubelet serves it"
    )]
    SocketMissing { path: PathBuf },
    /// The socket is there but could not be connected to (kubelet down, permissions).
    #[error(
        "cannot connect to the kubelet pod-resources socket {path}: {source}; check that the kubelet \
         is running and that the agent may open the socket (it is root-owned, mode 0660 or 0600)"
    )]
    Connect {
        path: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
    /// A call failed.
    #[error("kubelet pod-resources {method} at {path} failed: {status}{hint}", hint = rpc_hint(status))]
    Rpc { path: PathBuf, method: &'static str, status: tonic::Status },
}

fn rpc_hint(status: &tonic::Status) -> &'static str {
    match status.code() {
        tonic::Code::Unimplemented => {
            " (this kubelet does not serve that call: Get needs the \
                                        KubeletPodResourcesGet feature gate, GetAllocatableResources \
                                        Kubernetes 1.23+)"
        }
        tonic::Code::Unavailable => " (the kubelet went away; it is retried at the next refresh)",
        _ => "",
    }
}

impl PodResourcesError {
    /// A short, stable reason for a metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            PodResourcesError::SocketMissing { .. } => "socket_missing",
            PodResourcesError::Connect { .. } => "connect",
            PodResourcesError::Rpc { status, .. } if status.code() == tonic::Code::Unimplemented => "unimplemented",
            PodResourcesError::Rpc { .. } => "rpc",
        }
    }
}

/// A connected client.
#[derive(Clone, Debug)]
pub struct PodResourcesClient {
    path: PathBuf,
    inner: PodResourcesListerClient<Channel>,
}

impl PodResourcesClient {
    /// Connect to the socket at `path` (fails at once when nothing is there).
    pub async fn connect(path: &Path) -> Result<Self, PodResourcesError> {
        if !path.exists() {
            return Err(PodResourcesError::SocketMissing { path: path.into() });
        }
        // The URI is required by tonic but unused: the connector dials the Unix socket.
        let endpoint = Endpoint::from_static("http://[::]:50051").connect_timeout(CALL_TIMEOUT).timeout(CALL_TIMEOUT);
        let socket = path.to_path_buf();
        let channel = endpoint
            .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                let socket = socket.clone();
                async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(socket).await?)) }
            }))
            .await
            .map_err(|source| PodResourcesError::Connect { path: path.into(), source })?;
        let inner = PodResourcesListerClient::new(channel).max_decoding_message_size(MAX_DECODING_MESSAGE_BYTES);
        Ok(PodResourcesClient { path: path.into(), inner })
    }

    /// The socket this client talks to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn rpc(&self, method: &'static str) -> impl FnOnce(tonic::Status) -> PodResourcesError + '_ {
        move |status| PodResourcesError::Rpc { path: self.path.clone(), method, status }
    }

    /// Every pod on the node with its containers' resources.
    pub async fn list(&self) -> Result<api::ListPodResourcesResponse, PodResourcesError> {
        let mut inner = self.inner.clone();
        let r = inner.list(api::ListPodResourcesRequest {}).await.map_err(self.rpc("List"))?;
        Ok(r.into_inner())
    }

    /// What the node's device plugins can hand out.
    pub async fn allocatable(&self) -> Result<api::AllocatableResourcesResponse, PodResourcesError> {
        let mut inner = self.inner.clone();
        let r = inner
            .get_allocatable_resources(api::AllocatableResourcesRequest {})
            .await
            .map_err(self.rpc("GetAllocatableResources"))?;
        Ok(r.into_inner())
    }

    /// One pod's resources; `Ok(None)` when the kubelet does not know the pod (it answers gRPC
    /// `Unknown` with "pod … not found", not `NotFound`). Needs the `KubeletPodResourcesGet`
    /// feature gate on the kubelet; `List` works everywhere.
    pub async fn get(&self, namespace: &str, pod: &str) -> Result<Option<api::PodResources>, PodResourcesError> {
        let mut inner = self.inner.clone();
        let request = api::GetPodResourcesRequest { pod_name: pod.into(), pod_namespace: namespace.into() };
        match inner.get(request).await {
            Ok(r) => Ok(r.into_inner().pod_resources),
            Err(s)
                if matches!(s.code(), tonic::Code::Unknown | tonic::Code::NotFound)
                    && s.message().contains("not found") =>
            {
                Ok(None)
            }
            Err(s) => Err(self.rpc("Get")(s)),
        }
    }
}
