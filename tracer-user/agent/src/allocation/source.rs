//! [`AllocationSource`]: polls the kubelet pod-resources socket and keeps the last good answer.
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::task::JoinHandle;

use super::pod_resources::{PodResourcesClient, PodResourcesError};
use tracer_core::allocation::{AllocationStatus, GpuAllocations, GpuResourceNames};
use tracer_core::config::{KubeSettings, SourceMode};

struct State {
    current: Option<Arc<GpuAllocations>>,
    status: AllocationStatus,
}

struct Shared {
    socket: PathBuf,
    names: GpuResourceNames,
    state: Mutex<State>,
    // Held across a refresh, so two refreshes never interleave; `None` until connected and after a
    // failure (the next refresh reconnects, which is how a restarted kubelet is picked up).
    client: tokio::sync::Mutex<Option<PodResourcesClient>>,
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn refresh(&self) -> Result<(), PodResourcesError> {
        let mut client = self.client.lock().await;
        let result = self.fetch(&mut client).await;
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        let mut state = self.state();
        match result {
            Ok((allocations, allocatable_error)) => {
                if !state.status.available && state.status.last_error.is_some() {
                    tracing::info!(socket = %self.socket.display(), "kubelet pod-resources available again");
                }
                state.current = Some(Arc::new(allocations));
                let s = &mut state.status;
                s.available = true;
                s.last_success_unix_ns = Some(now);
                s.last_error = None;
                s.allocatable_error = allocatable_error;
                s.refreshes += 1;
                Ok(())
            }
            Err(e) => {
                *client = None;
                let kept_answer = state.current.is_some();
                let s = &mut state.status;
                // Log transitions, not every failed poll.
                if s.available || s.failures == 0 {
                    tracing::warn!(error = %e, kept_answer, "kubelet pod-resources unavailable");
                }
                s.available = false;
                s.last_error = Some(e.to_string());
                s.failures += 1;
                Err(e)
            }
        }
    }

    async fn fetch(
        &self,
        client: &mut Option<PodResourcesClient>,
    ) -> Result<(GpuAllocations, Option<String>), PodResourcesError> {
        let c = match client {
            Some(c) => c,
            None => client.insert(PodResourcesClient::connect(&self.socket).await?),
        };
        let list = c.list().await?;
        // Old kubelets lack GetAllocatableResources; the allocations are what matter.
        let (allocatable, allocatable_error) = match c.allocatable().await {
            Ok(a) => (Some(a), None),
            Err(e) => (None, Some(e.to_string())),
        };
        Ok((GpuAllocations::from_pod_resources(&list, allocatable.as_ref(), &self.names), allocatable_error))
    }
}

/// Polls the kubelet pod-resources API every interval. When the socket goes away the last good
/// answer is kept (and [`AllocationStatus::available`] turns false with the error); when it comes
/// back the next poll reconnects. Dropping it stops the polling.
pub struct AllocationSource {
    shared: Arc<Shared>,
    task: Option<JoinHandle<()>>,
}

impl AllocationSource {
    /// Start polling `settings.pod_resources_socket` every `every` on the current tokio runtime,
    /// after one refresh done here.
    ///
    /// [`SourceMode::Off`] gives `Ok(None)`. [`SourceMode::Required`] returns the first refresh's
    /// error (it names the cause and the fix). [`SourceMode::Auto`] keeps going without the socket:
    /// the status says "kubelet pod-resources not available at <path>" and later polls retry.
    pub async fn start(settings: &KubeSettings, every: Duration) -> Result<Option<Self>, PodResourcesError> {
        if settings.mode == SourceMode::Off {
            return Ok(None);
        }
        let shared = Arc::new(Shared {
            socket: settings.pod_resources_socket.clone(),
            names: GpuResourceNames::new(&settings.gpu_resource_names),
            state: Mutex::new(State {
                current: None,
                status: AllocationStatus { socket: settings.pod_resources_socket.clone(), ..Default::default() },
            }),
            client: tokio::sync::Mutex::new(None),
        });
        if let Err(e) = shared.refresh().await
            && settings.mode == SourceMode::Required
        {
            return Err(e);
        }
        let every = every.max(Duration::from_millis(10));
        let poller = shared.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                // The error is in the status (and logged on change).
                let _ = poller.refresh().await;
            }
        });
        Ok(Some(AllocationSource { shared, task: Some(task) }))
    }

    /// Refresh now (the poller does this every interval).
    pub async fn refresh(&self) -> Result<(), PodResourcesError> {
        self.shared.refresh().await
    }

    /// The last good answer; `None` until the kubelet has answered once.
    pub fn current(&self) -> Option<Arc<GpuAllocations>> {
        self.shared.state().current.clone()
    }

    /// How the source is doing.
    pub fn status(&self) -> AllocationStatus {
        self.shared.state().status.clone()
    }
}

impl Drop for AllocationSource {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}
