//! The API in process: the hub's accounting, the filters, and the real tonic server on a Unix
//! socket and on TCP with TLS, called by the real client.
use std::{os::unix::fs::PermissionsExt, sync::Arc, time::Duration};

use gpu_tracer_proto::{
    tonic::{Code, Streaming},
    v1::{self, subscribe_response::Response as R},
};

use super::{
    client::{self, ConnectSettings},
    filter::{FilterError, Filters},
    hub::{EventHub, HubSettings, Received},
    listen::{self, ApiAddr, ApiServer, ListenSettings},
    service::ApiState,
};
use crate::{
    export::{
        http::{HealthSettings, ServeState},
        metrics::MetricsRegistry,
    },
    probe::ProbeReport,
};

/// An event of `kind` from cgroup `cgroup_id` in pod `ns/pod`, at wall time `wall`.
fn event(kind: v1::EventKind, cgroup_id: u64, ns: &str, pod: &str, wall: u64) -> v1::Event {
    v1::Event {
        header: Some(v1::Header {
            kind: kind as i32,
            wall_time_unix_ns: wall,
            cgroup_id,
            cgroup_path: format!("/kubepods.slice/{pod}"),
            container: Some(v1::ContainerIdentity {
                namespace: ns.into(),
                pod: pod.into(),
                container: "main".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn alloc(i: u64) -> v1::Event {
    event(v1::EventKind::RmAlloc, 7, "ml", "trainer", i)
}

fn on_gpu(mut ev: v1::Event, minor: u32) -> v1::Event {
    ev.device = Some(v1::Device { kind: v1::DeviceKind::Gpu as i32, minor, file_id: 1 });
    ev
}

fn violation(gpu_uuid: &str) -> v1::Event {
    let mut ev = event(v1::EventKind::Violation, 9, "team-a", "rogue", 1);
    ev.payload = Some(v1::event::Payload::Violation(v1::Violation {
        kind: "unallocated_gpu_open".into(),
        namespace: "team-a".into(),
        pod: "rogue".into(),
        container: "main".into(),
        gpu_uuid: gpu_uuid.into(),
        ..Default::default()
    }));
    ev
}

fn filters(include: Vec<v1::EventFilter>, exclude: Vec<v1::EventFilter>) -> Filters {
    Filters::new(&include, &exclude).unwrap()
}

#[test]
fn filters_match_every_field_they_set_and_any_value_of_a_field() {
    let ns = filters(vec![v1::EventFilter { namespace: vec!["ml".into(), "x".into()], ..Default::default() }], vec![]);
    assert!(ns.matches(&alloc(1)));
    assert!(!ns.matches(&event(v1::EventKind::RmAlloc, 7, "other", "p", 1)));
    let both = filters(
        vec![v1::EventFilter {
            namespace: vec!["ml".into()],
            kind: vec![v1::EventKind::RmFree as i32],
            ..Default::default()
        }],
        vec![],
    );
    assert!(!both.matches(&alloc(1)), "namespace matches but kind does not");
    let gpu = filters(vec![v1::EventFilter { gpu: vec!["1".into(), "GPU-ab".into()], ..Default::default() }], vec![]);
    assert!(gpu.matches(&on_gpu(alloc(1), 1)));
    assert!(!gpu.matches(&on_gpu(alloc(1), 0)));
    assert!(!gpu.matches(&alloc(1)), "no device: not on GPU 1");
    assert!(gpu.matches(&violation("GPU-abcdef")), "a UUID prefix matches a violation's GPU");
    assert!(!gpu.matches(&violation("GPU-ffff")));
    let v = filters(vec![v1::EventFilter { violations_only: true, ..Default::default() }], vec![]);
    assert!(v.matches(&violation("GPU-1")) && !v.matches(&alloc(1)));
    // The violation's own pod names count, and an exclusion wins over an inclusion.
    let ex = filters(vec![], vec![v1::EventFilter { namespace: vec!["team-a".into()], ..Default::default() }]);
    assert!(!ex.matches(&violation("GPU-1")) && ex.matches(&alloc(1)));
    let prefix =
        filters(vec![v1::EventFilter { cgroup_path_prefix: vec!["/kubepods".into()], ..Default::default() }], vec![]);
    assert!(prefix.matches(&alloc(1)));
    assert!(filters(vec![], vec![]).matches(&alloc(1)));
}

#[test]
fn filters_refuse_empty_values_and_unknown_kinds() {
    let empty = v1::EventFilter { pod: vec![String::new()], ..Default::default() };
    assert_eq!(
        Filters::new(&[], &[v1::EventFilter::default(), empty]).unwrap_err(),
        FilterError::Empty { list: "exclude", index: 1, field: "pod" }
    );
    for k in [0, 30, -1, 999] {
        let f = v1::EventFilter { kind: vec![k], ..Default::default() };
        assert_eq!(
            Filters::new(&[f], &[]).unwrap_err(),
            FilterError::UnknownKind { list: "include", index: 0, value: k }
        );
    }
}

#[tokio::test]
async fn a_subscriber_that_falls_behind_learns_exactly_how_many_it_lost() {
    let hub = Arc::new(EventHub::new(HubSettings { history: 0, subscriber_buffer: 8, max_subscribers: 2 }));
    let mut sub = hub.subscribe().unwrap();
    for i in 1..=100 {
        hub.publish(alloc(i));
    }
    let (mut got, mut lost) = (Vec::new(), 0);
    loop {
        match sub.recv(3).await {
            Received::Events(ps) => {
                assert!(ps.len() <= 3, "at most the batch asked for");
                got.extend(ps.iter().map(|p| p.seq))
            }
            Received::Lost(n) => lost += n,
            Received::Closed => break,
        }
        if got.len() as u64 + lost == 100 {
            break;
        }
    }
    assert_eq!(lost, 92, "8 held, 92 lost");
    assert_eq!(got, (93..=100).collect::<Vec<_>>(), "the newest 8, in order");
    assert_eq!(hub.stats().lost, 92);
    assert_eq!(hub.stats().published, 100);
}

#[tokio::test]
async fn the_hub_refuses_subscribers_past_its_limit_and_frees_places_on_drop() {
    let hub = Arc::new(EventHub::new(HubSettings { history: 4, subscriber_buffer: 8, max_subscribers: 2 }));
    let a = hub.subscribe().unwrap();
    let _b = hub.subscribe().unwrap();
    assert!(hub.subscribe().is_err());
    assert_eq!(hub.stats().refused, 1);
    drop(a);
    let _c = hub.subscribe().expect("a's place is free again");
    assert!(hub.subscribe().is_err(), "two subscribers again");
    assert_eq!(hub.stats().subscribers, 2);
    // Closing hands out what is still held, then ends every subscription.
    hub.publish(alloc(1));
    hub.close();
    let mut d = _c;
    assert!(matches!(d.recv(16).await, Received::Events(e) if e.len() == 1));
    assert!(matches!(d.recv(16).await, Received::Closed));
}

#[test]
fn the_history_keeps_the_newest_events() {
    let hub = Arc::new(EventHub::new(HubSettings { history: 4, subscriber_buffer: 8, max_subscribers: 2 }));
    for i in 1..=10 {
        hub.publish(alloc(i));
    }
    let sub = hub.subscribe().unwrap();
    assert_eq!(sub.history.iter().map(|p| p.seq).collect::<Vec<_>>(), vec![7, 8, 9, 10]);
}

// ---- the server, through the real client ----

struct Running {
    hub: Arc<EventHub>,
    serve: Arc<ServeState>,
    server: Option<ApiServer>,
    conn: ConnectSettings,
    _dir: tempfile::TempDir,
}

impl Running {
    async fn start(hub: HubSettings, token: Option<&str>) -> Running {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/api.sock");
        let hub = Arc::new(EventHub::new(hub));
        let serve = Arc::new(ServeState::new(MetricsRegistry::new(), HealthSettings::default()));
        let state = Arc::new(ApiState::new(hub.clone(), serve.clone(), ProbeReport::nvml_only()));
        let settings =
            ListenSettings { addr: ApiAddr::Unix(path.clone()), tls: None, token: token.map(str::to_string) };
        let server = listen::serve(&settings, state).await.unwrap();
        let conn = ConnectSettings {
            addr: ApiAddr::Unix(path),
            token: token.map(str::to_string),
            tls_ca: None,
            tls_domain: None,
        };
        Running { hub, serve, server: Some(server), conn, _dir: dir }
    }

    async fn subscribe(&self, req: v1::SubscribeRequest) -> Result<Streaming<v1::SubscribeResponse>, Code> {
        let mut c = client::connect(&self.conn).await.unwrap();
        c.subscribe(req).await.map(|r| r.into_inner()).map_err(|s| s.code())
    }

    async fn stop(mut self) {
        self.hub.close();
        self.server.take().unwrap().shutdown(Duration::from_secs(2)).await;
    }
}

fn follow() -> v1::SubscribeRequest {
    v1::SubscribeRequest { follow: true, ..Default::default() }
}

/// Reads until `n` events have arrived or been reported lost, or the stream ends.
async fn read(stream: &mut Streaming<v1::SubscribeResponse>, n: usize) -> (Vec<v1::Event>, u64) {
    let (mut events, mut lost) = (Vec::new(), 0);
    while events.len() as u64 + lost < n as u64 {
        let m = tokio::time::timeout(Duration::from_secs(10), stream.message()).await.expect("a message in time");
        match m.unwrap().and_then(|m| m.response) {
            Some(R::Event(e)) => events.push(e),
            Some(R::LostEvents(l)) => lost += l.count,
            None => break,
        }
    }
    (events, lost)
}

/// Waits until the hub has `n` subscribers (a subscription is registered when the call is served).
async fn until_subscribers(hub: &EventHub, n: u64) {
    for _ in 0..500 {
        if hub.stats().subscribers == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{n} subscribers never connected: {:?}", hub.stats());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_follows_filters_and_replays_from_the_history() {
    let r = Running::start(HubSettings::default(), None).await;
    let mode = std::fs::metadata(match &r.conn.addr {
        ApiAddr::Unix(p) => p,
        ApiAddr::Tcp(_) => unreachable!(),
    })
    .unwrap()
    .permissions()
    .mode();
    assert_eq!(mode & 0o777, 0o660, "the socket is 0660");
    for i in 1..=5 {
        hub_publish(&r.hub, alloc(i));
    }
    hub_publish(&r.hub, event(v1::EventKind::RmFree, 8, "web", "frontend", 6));
    // Replay: since wall time 3 → events 3, 4, 5 and the free (no follow: the stream ends).
    let mut s = r.subscribe(v1::SubscribeRequest { since_unix_ns: 3, ..Default::default() }).await.unwrap();
    let (got, _) = read(&mut s, 100).await;
    assert_eq!(walls(&got), vec![3, 4, 5, 6]);
    // The newest two, the oldest two.
    let mut s = r.subscribe(v1::SubscribeRequest { number: 2, ..Default::default() }).await.unwrap();
    assert_eq!(walls(&read(&mut s, 100).await.0), vec![5, 6]);
    let mut s = r.subscribe(v1::SubscribeRequest { number: 2, first: true, ..Default::default() }).await.unwrap();
    assert_eq!(walls(&read(&mut s, 100).await.0), vec![1, 2]);
    // Follow with a namespace filter: only the new "ml" events, none of the history.
    let ml = v1::EventFilter { namespace: vec!["ml".into()], ..Default::default() };
    let mut s = r.subscribe(v1::SubscribeRequest { include: vec![ml], ..follow() }).await.unwrap();
    until_subscribers(&r.hub, 1).await;
    hub_publish(&r.hub, event(v1::EventKind::RmFree, 8, "web", "frontend", 7));
    hub_publish(&r.hub, alloc(8));
    let (got, lost) = read(&mut s, 1).await;
    assert_eq!((walls(&got), lost), (vec![8], 0));
    drop(s);
    r.stop().await;
}

/// Publishes one event and wakes the subscribers, as the agent does after each step.
fn hub_publish(hub: &EventHub, ev: v1::Event) {
    hub.publish(ev);
    hub.flush();
}

fn walls(evs: &[v1::Event]) -> Vec<u64> {
    evs.iter().map(|e| e.header.as_ref().unwrap().wall_time_unix_ns).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_subscriber_loses_counted_events_and_others_get_every_one() {
    let r = Running::start(HubSettings { history: 0, subscriber_buffer: 64, max_subscribers: 8 }, None).await;
    let mut fast = r.subscribe(follow()).await.unwrap();
    let mut stalled = r.subscribe(follow()).await.unwrap();
    until_subscribers(&r.hub, 2).await;
    const N: u64 = 20_000;
    let reader = tokio::spawn(async move {
        let (got, lost) = read(&mut fast, N as usize).await;
        (got.len() as u64, lost)
    });
    for i in 1..=N {
        r.hub.publish(alloc(i));
        if i % 256 == 0 {
            r.hub.flush();
            // Let the fast reader keep up (the stalled one reads nothing meanwhile).
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    r.hub.flush();
    let (fast_got, fast_lost) = reader.await.unwrap();
    assert_eq!(fast_got + fast_lost, N);
    // The stalled one now reads everything it still can: what it got plus what it was told it
    // lost is every event, exactly.
    let mut got = 0u64;
    let mut lost = 0u64;
    while got + lost < N {
        let m = tokio::time::timeout(Duration::from_secs(10), stalled.message()).await.unwrap().unwrap();
        match m.and_then(|m| m.response) {
            Some(R::Event(_)) => got += 1,
            Some(R::LostEvents(l)) => lost += l.count,
            None => break,
        }
    }
    assert_eq!(got + lost, N, "received {got} + lost {lost}");
    assert!(lost > 0, "the stalled subscriber fell behind");
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_subscribers_each_get_every_event() {
    let r = Running::start(HubSettings { history: 0, subscriber_buffer: 4096, max_subscribers: 128 }, None).await;
    let mut streams = Vec::new();
    for _ in 0..100 {
        streams.push(r.subscribe(follow()).await.unwrap());
    }
    until_subscribers(&r.hub, 100).await;
    for i in 1..=500 {
        r.hub.publish(alloc(i));
    }
    r.hub.flush();
    let readers: Vec<_> =
        streams.into_iter().map(|mut s| tokio::spawn(async move { read(&mut s, 500).await })).collect();
    for h in readers {
        let (got, lost) = h.await.unwrap();
        assert_eq!((got.len(), lost), (500, 0));
        assert_eq!(walls(&got), (1..=500).collect::<Vec<_>>());
    }
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_status_codes_and_leave_others_streaming() {
    let r = Running::start(HubSettings { history: 10, subscriber_buffer: 64, max_subscribers: 2 }, None).await;
    let mut good = r.subscribe(follow()).await.unwrap();
    until_subscribers(&r.hub, 1).await;
    let unknown = v1::EventFilter { kind: vec![77], ..Default::default() };
    assert_eq!(
        r.subscribe(v1::SubscribeRequest { include: vec![unknown], ..follow() }).await.err(),
        Some(Code::InvalidArgument)
    );
    assert_eq!(
        r.subscribe(v1::SubscribeRequest { first: true, ..Default::default() }).await.err(),
        Some(Code::InvalidArgument)
    );
    // A client that disconnects mid-stream frees its place.
    let gone = r.subscribe(follow()).await.unwrap();
    until_subscribers(&r.hub, 2).await;
    assert_eq!(r.subscribe(follow()).await.err(), Some(Code::ResourceExhausted), "max_subscribers = 2");
    drop(gone);
    until_subscribers(&r.hub, 1).await;
    // No snapshot yet: UNAVAILABLE, not an empty answer.
    let mut c = client::connect(&r.conn).await.unwrap();
    assert_eq!(c.get_snapshot(v1::GetSnapshotRequest {}).await.unwrap_err().code(), Code::Unavailable);
    let snap = crate::model::AgentSnapshot { api: Some(r.hub.stats()), ..Default::default() };
    r.serve.publish(Arc::new(snap));
    assert!(c.get_snapshot(v1::GetSnapshotRequest {}).await.is_ok());
    // The status carries the hub's counters as they were published.
    let status = c.get_status(v1::GetStatusRequest {}).await.unwrap().into_inner().status.unwrap();
    let api = status.api.expect("the hub's counters");
    assert_eq!((api.subscribers, api.refused), (1, 1), "{api:?}");
    assert!(status.otlp.is_none(), "OTLP is off");
    // The good subscriber never noticed.
    hub_publish(&r.hub, alloc(42));
    assert_eq!(walls(&read(&mut good, 1).await.0), vec![42]);
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_is_required_when_configured() {
    let r = Running::start(HubSettings::default(), Some("s3cret")).await;
    let mut c = client::connect(&r.conn).await.unwrap();
    assert!(c.get_status(v1::GetStatusRequest {}).await.is_ok());
    for wrong in [None, Some("wrong".to_string()), Some("s3cre".to_string())] {
        let conn = ConnectSettings { token: wrong, ..r.conn.clone() };
        let mut c = client::connect(&conn).await.unwrap();
        assert_eq!(c.get_status(v1::GetStatusRequest {}).await.unwrap_err().code(), Code::Unauthenticated);
        assert_eq!(c.subscribe(follow()).await.unwrap_err().code(), Code::Unauthenticated);
    }
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_socket_is_not_taken_over_and_a_stale_one_is_replaced() {
    let r = Running::start(HubSettings::default(), None).await;
    let ApiAddr::Unix(path) = r.conn.addr.clone() else { unreachable!() };
    let state = Arc::new(ApiState::new(r.hub.clone(), r.serve.clone(), ProbeReport::nvml_only()));
    let settings = ListenSettings { addr: ApiAddr::Unix(path.clone()), tls: None, token: None };
    let err = listen::serve(&settings, state.clone()).await.unwrap_err();
    assert!(matches!(err, listen::ListenError::InUse(_)), "{err}");
    // A socket file nobody listens on (a killed agent's) is replaced.
    let stale = path.with_file_name("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let settings = ListenSettings { addr: ApiAddr::Unix(stale.clone()), tls: None, token: None };
    let second = listen::serve(&settings, state.clone()).await.unwrap();
    second.shutdown(Duration::from_secs(1)).await;
    assert!(!stale.exists(), "the socket file is removed at shutdown");
    // A regular file is never removed.
    let file = path.with_file_name("file");
    std::fs::write(&file, "x").unwrap();
    let settings = ListenSettings { addr: ApiAddr::Unix(file.clone()), tls: None, token: None };
    assert!(matches!(listen::serve(&settings, state).await.unwrap_err(), listen::ListenError::NotASocket(_)));
    assert!(file.exists());
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_off_loopback_needs_tls_and_tls_with_a_token_works() {
    let hub = Arc::new(EventHub::new(HubSettings::default()));
    let serve = Arc::new(ServeState::new(MetricsRegistry::new(), HealthSettings::default()));
    let state = Arc::new(ApiState::new(hub.clone(), serve, ProbeReport::nvml_only()));
    let plain = ListenSettings { addr: ApiAddr::Tcp("0.0.0.0:0".parse().unwrap()), tls: None, token: None };
    assert!(matches!(listen::serve(&plain, state.clone()).await.unwrap_err(), listen::ListenError::NeedsTls(_)));

    let dir = tempfile::tempdir().unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["gpu-tracer.test".to_string()]).unwrap();
    let (cert_pem, key_pem) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_pem, cert.cert.pem()).unwrap();
    std::fs::write(&key_pem, cert.signing_key.serialize_pem()).unwrap();
    let tls = ListenSettings {
        addr: ApiAddr::Tcp("127.0.0.1:0".parse().unwrap()),
        tls: Some((cert_pem.clone(), key_pem)),
        token: Some("t0ken".into()),
    };
    let server = listen::serve(&tls, state).await.unwrap();
    let conn = ConnectSettings {
        addr: server.addr.clone(),
        token: Some("t0ken".into()),
        tls_ca: Some(cert_pem),
        tls_domain: Some("gpu-tracer.test".into()),
    };
    let mut c = client::connect(&conn).await.unwrap();
    let mut s = c.subscribe(follow()).await.unwrap().into_inner();
    until_subscribers(&hub, 1).await;
    hub_publish(&hub, alloc(5));
    assert_eq!(walls(&read(&mut s, 1).await.0), vec![5]);
    // Without the token: refused even over TLS.
    let mut c = client::connect(&ConnectSettings { token: None, ..conn.clone() }).await.unwrap();
    assert_eq!(c.get_status(v1::GetStatusRequest {}).await.unwrap_err().code(), Code::Unauthenticated);
    hub.close();
    server.shutdown(Duration::from_secs(2)).await;
}

#[test]
fn addresses_parse_with_reasons() {
    assert_eq!("unix:///run/x.sock".parse::<ApiAddr>(), Ok(ApiAddr::Unix("/run/x.sock".into())));
    assert_eq!("tcp://127.0.0.1:9401".parse::<ApiAddr>(), Ok(ApiAddr::Tcp("127.0.0.1:9401".parse().unwrap())));
    for bad in ["unix://relative.sock", "tcp://localhost", "/run/x.sock", "http://1.2.3.4:5"] {
        assert!(bad.parse::<ApiAddr>().is_err(), "{bad}");
    }
    assert_eq!(client::parse_kind("rm_alloc"), Ok(v1::EventKind::RmAlloc as i32));
    assert_eq!(client::parse_kind("EVENT_KIND_VIOLATION"), Ok(v1::EventKind::Violation as i32));
    assert!(client::parse_kind("unspecified").unwrap_err().contains("rm_alloc"));
}

/// With history kinds set, kinds outside them are wanted only while someone subscribes.
#[test]
fn history_kinds_decide_what_is_built_while_nobody_subscribes() {
    let kinds = [v1::EventKind::RmAlloc as i32].into_iter().collect();
    let hub = Arc::new(EventHub::new(HubSettings::default()).with_history_kinds(Some(kinds)));
    assert!(hub.wants_kind(v1::EventKind::RmAlloc as i32));
    assert!(!hub.wants_kind(v1::EventKind::RmControl as i32));
    let _sub = hub.subscribe().unwrap();
    assert!(hub.wants_kind(v1::EventKind::RmControl as i32), "a subscriber takes every kind");
    let no_history = EventHub::new(HubSettings { history: 0, ..HubSettings::default() });
    assert!(!no_history.wants_kind(v1::EventKind::RmAlloc as i32));
    // The config's names, and `all`.
    let mut api = crate::config::ApiSettings::default();
    assert!(api.history_kinds().unwrap().unwrap().contains(&(v1::EventKind::Violation as i32)));
    assert!(!api.history_kinds().unwrap().unwrap().contains(&(v1::EventKind::RmControl as i32)));
    api.history_kinds = vec!["all".into()];
    assert_eq!(api.history_kinds().unwrap(), None);
    api.history_kinds = vec!["rm_allocc".into()];
    assert!(api.history_kinds().unwrap_err().to_string().contains("rm_allocc"));
}
