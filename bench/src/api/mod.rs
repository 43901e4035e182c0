//! Section 8: the gRPC API's event delivery. The agent's real hub and tonic server on a Unix socket
//! (a 2-worker runtime, as `gpu-tracer agent` runs it) and the real client in its own thread,
//! fed with synthetic events shaped like the agent's (an RM allocation with a pod identity). No
//! kernel, no root. Reported: events delivered per second to one subscriber (at full speed, where
//! the subscriber falls behind and is told how many it lost, and paced at the goal rate), and the
//! fan-out to 100 subscribers — with the accounting `delivered + lost = published` checked for
//! every subscriber.
use std::{
    fmt::Write,
    sync::Arc,
    time::{Duration, Instant},
};

use gpu_tracer_proto::{prost::Message as _, tonic, v1};
use tracer_agent::export::{
    api::{
        hub::EventHub,
        listen::{self, ListenSettings},
        service::ApiState,
    },
    http::{HealthSettings, ServeState},
    metrics::MetricsRegistry,
};
use tracer_client::api::{self, ConnectSettings};
use tracer_core::config::api::{ApiAddr, HubSettings};

/// How a subscriber reads its stream.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Reader {
    /// The generated client: every `SubscribeResponse` decoded into messages.
    Decoding,
    /// The agent's bytes as received (`api::subscribe_raw`, as `events --connect` reads them):
    /// an event is kept as its encoded bytes, a `LostEvents` decoded. What the agent side
    /// delivers, without the client's decoding.
    Frames,
}

/// Events per second the issue asks one local subscriber to receive.
const GOAL_PER_S: f64 = 500_000.0;

/// One run: what was published and what each subscriber got.
pub struct Delivery {
    pub published: u64,
    pub publish_s: f64,
    /// Per subscriber: (events received, events reported lost, seconds from subscribe to last).
    pub subscribers: Vec<(u64, u64, f64)>,
    /// Encoded size of one event, bytes.
    pub event_bytes: usize,
}

impl Delivery {
    fn exact(&self) -> bool {
        self.subscribers.iter().all(|(got, lost, _)| got + lost == self.published)
    }
    fn delivered(&self) -> u64 {
        self.subscribers.iter().map(|s| s.0).sum()
    }
    fn lost(&self) -> u64 {
        self.subscribers.iter().map(|s| s.1).sum()
    }
    fn slowest_s(&self) -> f64 {
        self.subscribers.iter().map(|s| s.2).fold(0.0, f64::max)
    }
}

/// One encoding shared against one per consumer, offline on one core (ns per event).
pub struct SharingMeasured {
    pub events: usize,
    pub subscribers: usize,
    /// Preparing one event for `subscribers` subscribers: an encoding each / one encoding and a
    /// shared `Bytes` each (what the hub does).
    pub encode_each_ns: f64,
    pub shared_ns: f64,
    /// `events --connect` writing protobuf: decode the response and encode the event again (before)
    /// / write the bytes as received (`EventWriter::write_encoded`).
    pub reencode_ns: f64,
    pub pass_through_ns: f64,
}

/// Median of 5 timings of `f` over the events, ns per event.
fn ns_per_event(events: usize, mut f: impl FnMut()) -> f64 {
    let mut v: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_nanos() as f64 / events as f64
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[2]
}

fn sharing(quick: bool) -> SharingMeasured {
    use std::hint::black_box;
    use tracer_client::events::{EventFormat, EventWriter};
    let events: Vec<v1::Event> = (0..if quick { 2_000 } else { 20_000 }).map(sample_event).collect();
    let subscribers = 100;
    let n = events.len();
    let fan = n / 10; // 100 deliveries per event: a tenth of the events keeps the runs short.
    let encode_each_ns = ns_per_event(fan, || {
        for ev in &events[..fan] {
            for _ in 0..subscribers {
                black_box(EventHub::encode(ev));
            }
        }
    });
    let shared_ns = ns_per_event(fan, || {
        for ev in &events[..fan] {
            let enc = EventHub::encode(ev);
            for _ in 0..subscribers {
                black_box(enc.clone());
            }
        }
    });
    let encoded: Vec<_> = events.iter().map(EventHub::encode).collect();
    let mut w = EventWriter::new(Vec::with_capacity(n * 1024), EventFormat::Protobuf);
    let reencode_ns = ns_per_event(n, || {
        for e in &encoded {
            let r = <v1::SubscribeResponse as gpu_tracer_proto::prost::Message>::decode(&e.0[..]).unwrap();
            if let Some(v1::subscribe_response::Response::Event(ev)) = r.response {
                w.write(&ev).unwrap();
            }
        }
    });
    let mut w = EventWriter::new(Vec::with_capacity(n * 1024), EventFormat::Protobuf);
    let pass_through_ns = ns_per_event(n, || {
        for e in &encoded {
            w.write_encoded(e).unwrap();
        }
    });
    SharingMeasured { events: n, subscribers, encode_each_ns, shared_ns, reencode_ns, pass_through_ns }
}

pub struct ApiMeasured {
    pub sharing: SharingMeasured,
    pub full_speed: Delivery,
    pub frames: Delivery,
    pub paced: Delivery,
    pub paced_frames: Delivery,
    pub fan_out: Delivery,
    pub fan_out_rate: f64,
}

pub struct ApiSection {
    pub result: Result<ApiMeasured, String>,
}

impl ApiSection {
    pub fn skipped(why: &str) -> Self {
        Self { result: Err(why.into()) }
    }
}

/// An event like the agent's: a successful 2 MiB vidmem RM allocation by a pod's process.
pub(crate) fn sample_event(i: u64) -> v1::Event {
    v1::Event {
        header: Some(v1::Header {
            kind: v1::EventKind::RmAlloc as i32,
            ktime_ns: 1_000_000 + i,
            wall_time_unix_ns: 1_764_000_000_000_000_000 + i,
            tgid: 4242,
            pid: 4243,
            process_start_time_ns: 123_456_789,
            cgroup_id: 98_765,
            cgroup_path: "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c3d4e_5f60_7182_93a4_b5c6d7e8f901.slice/cri-containerd-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope".into(),
            comm: "python3".into(),
            duration_ns: 25_000,
            syscall_ret: 0,
            container: Some(v1::ContainerIdentity {
                kind: "container".into(),
                runtime: "containerd".into(),
                container_id: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef".into(),
                pod_uid: "1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901".into(),
                qos: "burstable".into(),
                namespace: "ml".into(),
                pod: "trainer-7d9f8b6c5-x2x9q".into(),
                container: "main".into(),
                owner_kind: "Deployment".into(),
                owner_name: "trainer".into(),
                ..Default::default()
            }),
        }),
        device: Some(v1::Device { kind: v1::DeviceKind::Ctl as i32, minor: 0, file_id: 0xffff_8881_0000_0000 }),
        fd: Some(5),
        payload: Some(v1::event::Payload::RmAlloc(v1::RmAlloc {
            client: 0xc1d0_0001,
            parent: 0xcaf0_0001,
            handle: 0xcaf0_0100 + (i as u32 & 0xff),
            class_id: 0x0040,
            status: 0,
            success: true,
            bytes: 2 << 20,
            location: v1::MemoryLocation::Vidmem as i32,
            ..Default::default()
        })),
    }
}

/// Reads until `n` events are received or reported lost (or the stream ends, or 30 s pass without
/// a message): (received, lost, seconds).
async fn read_decoding(mut stream: tonic::Streaming<v1::SubscribeResponse>, n: u64) -> (u64, u64, f64) {
    use v1::subscribe_response::Response as R;
    let start = Instant::now();
    let (mut got, mut lost) = (0u64, 0u64);
    while got + lost < n {
        let Ok(Ok(Some(m))) = tokio::time::timeout(Duration::from_secs(30), stream.message()).await else { break };
        match m.response {
            Some(R::Event(_)) => got += 1,
            Some(R::LostEvents(l)) => lost += l.count,
            None => {}
        }
    }
    (got, lost, start.elapsed().as_secs_f64())
}

/// [`read_decoding`] over the raw responses.
async fn read_frames(mut stream: tonic::Streaming<api::Received>, n: u64) -> (u64, u64, f64) {
    let start = Instant::now();
    let (mut got, mut lost) = (0u64, 0u64);
    while got + lost < n {
        let Ok(Ok(Some(m))) = tokio::time::timeout(Duration::from_secs(30), stream.message()).await else { break };
        match m {
            api::Received::Event(_) => got += 1,
            api::Received::Lost(l) => lost += l.count.max(1),
        }
    }
    (got, lost, start.elapsed().as_secs_f64())
}

/// Publishes `n` events at `rate` per second (`None`: as fast as the hub takes them) to
/// `subscribers` clients, and reads every stream to its end.
fn deliver(n: u64, rate: Option<f64>, subscribers: usize, reader: Reader) -> Result<Delivery, String> {
    let dir = std::env::temp_dir().join(format!("gt-bench-api-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let path = dir.join("api.sock");
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let hub = Arc::new(EventHub::new(HubSettings {
        history: 10_000,
        subscriber_buffer: HubSettings::default().subscriber_buffer,
        max_subscribers: subscribers.max(128),
    }));
    let serve = Arc::new(ServeState::new(MetricsRegistry::new(), HealthSettings::default()));
    let state = Arc::new(ApiState::new(hub.clone(), serve, tracer_agent::probe::nvml_only_report()));
    let settings = ListenSettings { addr: ApiAddr::Unix(path.clone()), tls: None, token: None };
    let server = server_rt.block_on(listen::serve(&settings, state)).map_err(|e| e.to_string())?;
    let conn = ConnectSettings { addr: ApiAddr::Unix(path), token: None, tls_ca: None, tls_domain: None };
    // The clients: one thread, one runtime, a task per subscriber.
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let clients = std::thread::spawn(move || -> Result<Vec<(u64, u64, f64)>, String> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
        rt.block_on(async move {
            let mut tasks = Vec::new();
            for _ in 0..subscribers {
                let req = v1::SubscribeRequest { follow: true, ..Default::default() };
                tasks.push(match reader {
                    Reader::Decoding => {
                        let mut c = api::connect(&conn).await.map_err(|e| e.to_string())?;
                        let stream = c.subscribe(req).await.map_err(|e| e.to_string())?.into_inner();
                        tokio::spawn(read_decoding(stream, n))
                    }
                    Reader::Frames => {
                        let stream = api::subscribe_raw(&conn, req).await.map_err(|e| e.to_string())?;
                        tokio::spawn(read_frames(stream, n))
                    }
                });
            }
            let _ = ready_tx.send(());
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.map_err(|e| e.to_string())?);
            }
            Ok(out)
        })
    });
    ready_rx.recv_timeout(Duration::from_secs(30)).map_err(|_| "the subscribers did not connect".to_string())?;
    while hub.stats().subscribers < subscribers as u64 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let events: Vec<v1::Event> = (0..1024).map(sample_event).collect();
    let start = Instant::now();
    for i in 0..n {
        if let Some(r) = rate {
            // Paced in batches of 256: sleep until the batch is due.
            if i % 256 == 0 {
                let due = Duration::from_secs_f64(i as f64 / r);
                if let Some(wait) = due.checked_sub(start.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
        }
        hub.publish(events[(i % 1024) as usize].clone());
    }
    hub.flush();
    let publish_s = start.elapsed().as_secs_f64();
    let subscribers = clients.join().map_err(|_| "a client thread panicked".to_string())??;
    hub.close();
    server_rt.block_on(server.shutdown(Duration::from_secs(5)));
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Delivery { published: n, publish_s, subscribers, event_bytes: sample_event(1).encoded_len() })
}

pub fn section(quick: bool) -> ApiSection {
    let scale = if quick { 10 } else { 1 };
    let run = || -> Result<ApiMeasured, String> {
        crate::progress("section 8: API, one subscriber at full speed");
        let full_speed = deliver(2_000_000 / scale, None, 1, Reader::Decoding)?;
        crate::progress("section 8: API, one frame-counting subscriber at full speed");
        let frames = deliver(2_000_000 / scale, None, 1, Reader::Frames)?;
        crate::progress("section 8: API, one subscriber paced at 500k events/s");
        let paced = deliver(1_000_000 / scale, Some(GOAL_PER_S), 1, Reader::Decoding)?;
        crate::progress("section 8: API, one frame-counting subscriber paced at 500k events/s");
        let paced_frames = deliver(1_000_000 / scale, Some(GOAL_PER_S), 1, Reader::Frames)?;
        crate::progress("section 8: API, 100 subscribers");
        let fan_out_rate = 10_000.0;
        let fan_out = deliver(50_000 / scale, Some(fan_out_rate), 100, Reader::Frames)?;
        crate::progress("section 8: one encoding shared against one per consumer (offline)");
        let sharing = sharing(quick);
        Ok(ApiMeasured { sharing, full_speed, frames, paced, paced_frames, fan_out, fan_out_rate })
    };
    ApiSection { result: run() }
}

impl ApiSection {
    pub fn render(&self, s: &mut String) {
        let _ = writeln!(s, "## 8. Event API: delivery to subscribers\n");
        let _ = writeln!(
            s,
            "**Method.** The agent's own `EventHub` and tonic server (`tracer_agent::export::api`) on a Unix socket, on a \
             2-worker runtime as `gpu-tracer agent` runs it; the real client (`tracer_client::api`) in another \
             thread, one task per subscriber, each following the stream and counting events and `LostEvents`. \
             A publisher thread (the agent loop's place; the hub wakes subscribers every 256 events, as the agent does once per step) publishes synthetic events shaped like the agent's (an RM \
             allocation with a pod identity) — at full speed, then paced at the goal rate, then to 100 \
             subscribers. All on this machine's CPUs at once. Run alone with `cargo xtask bench --only 8`. \
             **Goal:** ≥ {:.0} k events/s to one local subscriber, with `received + lost = published` exact.\n",
            GOAL_PER_S / 1000.0
        );
        let m = match &self.result {
            Err(e) => {
                let _ = writeln!(s, "not measured: {e}\n");
                return;
            }
            Ok(m) => m,
        };
        let _ = writeln!(
            s,
            "| run | published | publish rate (k/s) | subscribers | delivered | lost (told) | delivered rate (k/s, per subscriber) | received + lost = published |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---|");
        for (name, d) in [
            ("one decoding subscriber, full speed", &m.full_speed),
            ("one frame-counting subscriber, full speed", &m.frames),
            ("one decoding subscriber, paced at the goal", &m.paced),
            ("one frame-counting subscriber, paced at the goal", &m.paced_frames),
            ("100 frame-counting subscribers", &m.fan_out),
        ] {
            let per_sub = d.delivered() as f64 / d.subscribers.len().max(1) as f64;
            let _ = writeln!(
                s,
                "| {name} | {} | {:.0} | {} | {} | {} | {:.0} | {} |",
                d.published,
                d.published as f64 / d.publish_s / 1000.0,
                d.subscribers.len(),
                d.delivered(),
                d.lost(),
                per_sub / d.slowest_s().max(1e-9) / 1000.0,
                if d.exact() { "exact" } else { "**not exact**" }
            );
        }
        let _ = writeln!(
            s,
            "\nOne event is {} bytes encoded. A *decoding* subscriber is the generated client, decoding every \
             `SubscribeResponse` into messages (as any consumer generated from the `.proto` does); a *frame-counting* \
             one reads the same \
             stream keeping each event as the bytes received (`api::subscribe_raw`, as `events --connect` reads \
             it; `LostEvents` are decoded): what the agent delivers, without the client's decoding. Both share this machine's CPUs with the \
             publisher and the server. \"Delivered rate\" is events received divided by the time from subscribing \
             to the stream's end (it includes the wait for the publisher; for the paced runs it is bounded by the \
             publish rate). The 100-subscriber run publishes at {:.0} k/s, i.e. {:.1} M deliveries/s in all.\n",
            m.full_speed.event_bytes,
            m.fan_out_rate / 1000.0,
            m.fan_out_rate * 100.0 / 1e6
        );
        let h = &m.sharing;
        let _ = writeln!(
            s,
            "**One encoding per event, shared (issue 18).** Offline on one core, {} events, median of 5 passes: \
             the CPU the agent spends per event on what its consumers get, and what `events --connect` spends \
             writing the agent's stream as protobuf.\n",
            h.events
        );
        let _ = writeln!(s, "| consumers of one event | per event (ns) | ratio |");
        let _ = writeln!(s, "|---|---:|---:|");
        let _ = writeln!(
            s,
            "| {} subscribers, an encoding each | {:.0} | {:.1}× |",
            h.subscribers,
            h.encode_each_ns,
            h.encode_each_ns / h.shared_ns.max(1e-9)
        );
        let _ = writeln!(
            s,
            "| {} subscribers, one encoding shared as `Bytes` (the hub) | {:.0} | 1.0× |",
            h.subscribers, h.shared_ns
        );
        let _ = writeln!(
            s,
            "| `events --connect` to protobuf: decode, encode again (before) | {:.0} | {:.1}× |",
            h.reencode_ns,
            h.reencode_ns / h.pass_through_ns.max(1e-9)
        );
        let _ = writeln!(
            s,
            "| `events --connect` to protobuf: the agent's bytes as received (`write_encoded`) | {:.0} | 1.0× |\n",
            h.pass_through_ns
        );
    }
}
