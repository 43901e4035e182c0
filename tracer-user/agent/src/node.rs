//! The node agent as a library: the pipeline with everything `gpu-tracer agent` serves from it —
//! `/metrics`, `/healthz` and `/readyz` (`export::http`), the gRPC API and its event hub
//! (`export::api`), OTLP export (`export::otlp`), the bill in the event stream once a minute, and
//! the profiling sessions `profile --connect` asks for (`profile::desk`).
//!
//! [`NodeAgent::start`] checks every setting that can be checked before anything loads (the OTLP
//! settings, TLS material and tokens), loads and attaches the probes, starts Kubernetes identity
//! and binds the servers; [`NodeAgent::run`] runs the loop until a signal, the duration, or a
//! [`StopHandle`], then stops the servers. The binary, the tests and the benchmarks start an agent
//! this way (or run the binary, which does).
use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use gpu_tracer_proto::v1;
use tracer_core::{
    clock,
    config::{Config, api::HubSettings, otlp::OtlpSettings},
    cost::bill::BillWriter,
    decode::Event,
    filter::EventKey,
    model::{EventContext, probes::ProbeReport},
    wire::events::{kind_of, to_proto},
};

use crate::{
    export::{
        api::{
            hub::EventHub,
            listen::{self, ApiServer, ListenSettings},
            service::ApiState,
        },
        bill_writer_for_this_process,
        http::{HealthSettings, RunningServer, ServeLimits, ServeSecurity, ServeState, serve_secure},
        metrics::MetricsRegistry,
        otlp::{OtlpExporter, ResourceInfo},
        stream::{self, Emit},
    },
    pipeline::Agent,
    profile::{desk::ProfileDesk, session::LOCK_DIR},
    runner::{self, Flow, Schedule, Stopped},
};

/// How the node agent runs, beside its configuration.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// Where `/metrics`, `/healthz` and `/readyz` are served (port 0: the kernel picks one).
    pub listen: SocketAddr,
    /// Stop after this long (`None`: until a signal or a [`StopHandle`]).
    pub duration: Option<Duration>,
}

/// Asks a running [`NodeAgent`] to stop (it does after its current step, as on SIGTERM).
#[derive(Clone, Debug)]
pub struct StopHandle(Arc<AtomicBool>);

impl StopHandle {
    pub fn stop(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A started node agent: probes attached, servers bound, the loop not yet running.
pub struct NodeAgent {
    agent: Agent,
    publish: Publish,
    hub: Arc<EventHub>,
    server: RunningServer,
    api_server: Option<ApiServer>,
    schedule: Schedule,
    scheme: &'static str,
}

impl NodeAgent {
    /// Check the settings, load and attach the probes, start Kubernetes identity, and bind the
    /// HTTP server and the gRPC API (`cfg.api.listen`). Errors name the setting or step that failed.
    pub async fn start(cfg: Config, opts: NodeOptions) -> Result<NodeAgent> {
        let interval = Duration::from_millis(cfg.snapshot_interval_ms.max(100));
        let api_listen = match cfg.api.addr()? {
            Some(addr) => Some(ListenSettings {
                addr,
                tls: cfg.api.tls_cert.clone().zip(cfg.api.tls_key.clone()),
                token: cfg
                    .api
                    .token_file
                    .as_deref()
                    .map(|p| tracer_core::config::read_token_file("api.token_file", p))
                    .transpose()?,
            }),
            None => None,
        };
        let hub = Arc::new(
            EventHub::new(HubSettings {
                history: cfg.api.history,
                subscriber_buffer: cfg.api.subscriber_buffer,
                max_subscribers: cfg.api.max_subscribers,
            })
            .with_history_kinds(cfg.api.history_kinds()?),
        );
        // OTLP settings are checked before the probes load (a bad value is a clear error, early).
        let otlp_settings = OtlpSettings::resolve(&cfg.otlp, |k| std::env::var(k).ok())?;
        let cgroup_label = cfg.metrics.cgroup_label;
        // TLS material and the token are read before the probes load, too.
        let security = ServeSecurity::load(
            cfg.metrics.tls_cert.as_deref(),
            cfg.metrics.tls_key.as_deref(),
            cfg.metrics.token_file.as_deref(),
        )
        .context("the metrics endpoint's TLS or token")?;
        let otlp_who = ResourceInfo::detect(cfg.kubernetes.node_name.as_deref());
        let (profiles, profile_control) =
            ProfileDesk::new(PathBuf::from(LOCK_DIR), cfg.families.cuda && cfg.cuda_timed_calls);
        let bills = bill_writer_for_this_process(cfg.kubernetes.node_name.as_deref());
        let mut agent = Agent::start(cfg).context("starting the tracer")?;
        agent.start_kubernetes().await.context("starting Kubernetes identity")?;
        agent.log_report();
        let otlp = OtlpExporter::start(otlp_settings, &otlp_who).context("starting OTLP export")?;
        let registry = MetricsRegistry::new().with_process_metrics().with_cgroup_label(cgroup_label);
        let state = Arc::new(ServeState::new(registry, HealthSettings::default()).with_token(security.token.clone()));
        state.mark_attached(agent.report().attach_mode.as_str());
        let api =
            Arc::new(ApiState::new(hub.clone(), state.clone(), agent.report().clone()).with_profiles(profile_control));
        let scheme = if security.tls.is_some() { "https" } else { "http" };
        let server = serve_secure(opts.listen, state.clone(), ServeLimits::default(), security.tls.clone())
            .await
            .context("starting the metrics server")?;
        tracing::info!(listen = %server.local_addr, scheme, token = security.token.is_some(), "serving /metrics, /healthz, /readyz");
        let api_server = match &api_listen {
            Some(l) => {
                Some(listen::serve(l, api.clone()).await.context("starting the gRPC API (api.listen, --grpc-listen)")?)
            }
            None => None,
        };
        let schedule = Schedule { interval, tick_at_start: true, duration: opts.duration };
        let publish = Publish {
            serve: state,
            api,
            last_batch: Instant::now(),
            otlp,
            bills,
            profiles,
            stop: Arc::new(AtomicBool::new(false)),
        };
        Ok(NodeAgent { agent, publish, hub, server, api_server, schedule, scheme })
    }

    /// Where `/metrics` is served.
    pub fn metrics_addr(&self) -> SocketAddr {
        self.server.local_addr
    }

    /// `https` with `metrics.tls_cert`, else `http`.
    pub fn metrics_scheme(&self) -> &'static str {
        self.scheme
    }

    /// Where the gRPC API is served (`None`: `api.listen = "off"`).
    pub fn api_addr(&self) -> Option<String> {
        self.api_server.as_ref().map(|s| s.addr.to_string())
    }

    /// What loading and attaching the probes did.
    pub fn report(&self) -> &ProbeReport {
        self.agent.report()
    }

    /// A handle that stops [`run`](Self::run) from another task or thread.
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle(self.publish.stop.clone())
    }

    /// Run until SIGINT/SIGTERM, the duration, or a [`StopHandle`]; then close the hub (every
    /// subscription ends), flush OTLP (at most 5 s), and stop the gRPC API and the HTTP server.
    pub async fn run(self) -> Result<Stopped> {
        let NodeAgent { mut agent, mut publish, hub, server, api_server, schedule, scheme: _ } = self;
        let result = runner::run(&mut agent, schedule, &mut publish).await;
        hub.close();
        if let Some(o) = publish.otlp.take() {
            let s = o.shutdown(Duration::from_secs(5));
            tracing::info!(
                metric_points = s.metric_points_exported,
                log_records = s.log_records_exported,
                dropped = s.dropped.iter().map(|d| d.count).sum::<u64>(),
                "OTLP export stopped"
            );
        }
        if let Some(s) = api_server {
            s.shutdown(Duration::from_secs(2)).await;
        }
        let stopped = result?;
        server.shutdown().await.context("stopping the metrics server")?;
        Ok(stopped)
    }
}

/// Heartbeat every step; every event to the hub (and OTLP); a snapshot published every tick.
struct Publish {
    serve: Arc<ServeState>,
    api: Arc<ApiState>,
    last_batch: Instant,
    otlp: Option<OtlpExporter>,
    /// The node's bill into the event stream, once a minute.
    bills: BillWriter,
    /// Profiling sessions (`profile --connect`).
    profiles: ProfileDesk,
    /// Set by a [`StopHandle`].
    stop: Arc<AtomicBool>,
}

/// The hub and, when OTLP export is on, the exporter (which keeps the kinds it exports).
struct Tee<'a> {
    hub: &'a EventHub,
    otlp: Option<&'a OtlpExporter>,
}

impl Tee<'_> {
    /// Does the hub or OTLP take an event of this kind? (Decides before the message is built:
    /// most ioctls are RM controls, which nobody takes while no one subscribes.)
    fn wants_kind(&self, kind: i32) -> bool {
        self.hub.wants_kind(kind) || self.otlp.is_some_and(|o| o.wants(kind))
    }

    /// A decoded event, converted only when someone takes its kind.
    fn event(&mut self, ev: &Event, ctx: &EventContext) {
        if self.wants_kind(kind_of(ev, ctx) as i32) {
            self.emit(to_proto(ev, ctx));
        }
    }
}

impl Emit for Tee<'_> {
    fn wants(&self) -> bool {
        self.otlp.is_some() || self.hub.wants_events()
    }

    /// One encoding of the event, shared by the hub's subscribers and the OTLP queue.
    fn emit(&mut self, ev: v1::Event) {
        let kind = ev.header.as_ref().map_or(0, |h| h.kind);
        let otlp = self.otlp.filter(|o| o.accepts(&ev));
        let hub = self.hub.wants_kind(kind);
        if otlp.is_none() && !hub {
            return;
        }
        let key = EventKey::of(&ev);
        let encoded = EventHub::encode(&ev);
        drop(ev);
        match otlp {
            Some(o) if hub => {
                o.offer_encoded(encoded.clone());
                self.hub.publish_encoded(key, encoded);
            }
            Some(o) => o.offer_encoded(encoded),
            None => self.hub.publish_encoded(key, encoded),
        }
    }
}

impl runner::Handler for Publish {
    type Error = anyhow::Error;

    fn event(&mut self, ev: &Event, ctx: &EventContext) {
        Tee { hub: &self.api.hub, otlp: self.otlp.as_ref() }.event(ev, ctx);
    }

    fn stepped(&mut self, agent: &mut Agent) {
        self.serve.heartbeat();
        // A session's edges: the ring buffer drained and the launch counts sent, so that what
        // the window counted is exactly what its stream carries.
        let (hub, otlp, last_batch) = (&self.api.hub, self.otlp.as_ref(), &mut self.last_batch);
        self.profiles.serve(agent, hub, &mut |agent| {
            let mut tee = Tee { hub, otlp };
            agent.drain(&mut |ev, ctx| tee.event(ev, ctx));
            stream::launch_batches(&mut tee, agent, last_batch.elapsed());
            *last_batch = Instant::now();
        });
        // Subscribers are woken once per step for the events it applied, not once per event.
        self.api.hub.flush();
    }

    fn tick(&mut self, agent: &mut Agent) -> Result<Flow> {
        let hub = self.api.hub.clone();
        let mut tee = Tee { hub: &hub, otlp: self.otlp.as_ref() };
        agent.drain(&mut |ev, ctx| tee.event(ev, ctx));
        stream::launch_batches(&mut tee, agent, self.last_batch.elapsed());
        self.last_batch = Instant::now();
        let mut snap = agent.snapshot();
        if let Some(ev) = self.bills.due(&snap, clock::wall_now_unix_ns()) {
            tee.emit(ev);
        }
        stream::violations(&mut tee, agent);
        snap.otlp = self.otlp.as_ref().map(OtlpExporter::stats);
        snap.api = Some(self.api.stats());
        snap.http = Some(self.serve.http_stats());
        let snap = Arc::new(snap);
        if let Some(o) = &self.otlp {
            o.publish(snap.clone());
        }
        self.serve.publish(snap);
        self.api.hub.flush();
        self.api.set_report(agent.report().clone());
        Ok(Flow::Continue)
    }

    fn should_stop(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}
