//! The API in process: the hub's accounting, the filters, and the real tonic server on a Unix
//! socket and on TCP with TLS, called by the real client.
use std::{os::unix::fs::PermissionsExt, sync::Arc, time::Duration};

use gpu_tracer_proto::{
    EncodedSubscribeResponse,
    tonic::{Code, Streaming},
    v1::{self, subscribe_response::Response as R},
};
use proptest::prelude::*;

use super::{
    hub::{EventHub, Published, Received},
    listen::{self, ApiServer, ListenSettings},
    service::ApiState,
};
use crate::export::{
    http::{HealthSettings, ServeState},
    metrics::MetricsRegistry,
};
use tracer_client::api::{self, ConnectSettings};
use tracer_core::config::api::{ApiAddr, HubSettings};
use tracer_core::filter::{EventKey, FilterError, Filters};

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
    for k in [0, 32, -1, 999] {
        let f = v1::EventFilter { kind: vec![k], ..Default::default() };
        assert_eq!(
            Filters::new(&[f], &[]).unwrap_err(),
            FilterError::UnknownKind { list: "include", index: 0, value: k }
        );
    }
    // The error names the kinds this build knows (it said 1..=29 when 30 and 31 were valid).
    let last = tracer_core::filter::last_event_kind();
    assert!(last >= 31 && v1::EventKind::try_from(last + 1).is_err(), "{last}");
    let f = v1::EventFilter { kind: vec![last], ..Default::default() };
    Filters::new(&[f], &[]).unwrap();
    let e = FilterError::UnknownKind { list: "include", index: 0, value: last + 1 }.to_string();
    assert!(e.contains(&format!("EventKind 1..={last};")), "{e}");
}

/// `event` as the hub would hold it.
fn published(ev: &v1::Event) -> Published {
    let encoded = EncodedSubscribeResponse::new(&v1::SubscribeResponse { response: Some(R::Event(ev.clone())) });
    Published { seq: 1, key: EventKey::of(ev), encoded }
}

/// Events over every field a filter reads, from a few values each (so that filters hit).
fn any_event() -> impl Strategy<Value = v1::Event> {
    let names = || prop::sample::select(vec!["", "ml", "web"]);
    let kinds = prop::sample::select(vec![v1::EventKind::RmAlloc, v1::EventKind::RmFree, v1::EventKind::Violation]);
    let device = prop_oneof![
        Just(None),
        (0u32..3).prop_map(|minor| Some(v1::Device { kind: v1::DeviceKind::Gpu as i32, minor, file_id: 1 })),
        Just(Some(v1::Device { kind: v1::DeviceKind::Ctl as i32, minor: 1, file_id: 1 })),
    ];
    let violation = prop::option::of((
        names(),
        names(),
        prop::sample::select(vec!["", "GPU-ab", "GPU-cd"]),
        prop::option::of(0u32..3),
    ));
    (any::<bool>(), any::<bool>(), kinds, 0u64..3, names(), names(), 0u64..4, device, violation).prop_map(
        |(header, container, kind, cgroup_id, ns, pod, wall, device, violation)| {
            let mut ev = event(kind, cgroup_id, ns, pod, wall);
            let h = ev.header.as_mut().unwrap();
            h.cgroup_path = format!("/{}/{pod}", if cgroup_id == 0 { "kubepods" } else { "system.slice" });
            if !container {
                h.container = None;
            }
            if !header {
                ev.header = None;
            }
            ev.device = device;
            ev.payload = violation.map(|(ns, pod, gpu_uuid, gpu_minor)| {
                v1::event::Payload::Violation(v1::Violation {
                    namespace: ns.into(),
                    pod: pod.into(),
                    container: "main".into(),
                    gpu_uuid: gpu_uuid.into(),
                    gpu_minor,
                    ..Default::default()
                })
            });
            ev
        },
    )
}

fn any_filter() -> impl Strategy<Value = v1::EventFilter> {
    let some = |values: Vec<&'static str>| prop::collection::vec(prop::sample::select(values), 0..=2);
    let kinds = prop::sample::select(vec![v1::EventKind::RmAlloc as i32, v1::EventKind::Violation as i32]);
    (
        some(vec!["ml", "web", "other"]),
        some(vec!["trainer", "frontend"]),
        some(vec!["main", "side"]),
        prop::collection::vec(0u64..3, 0..=1),
        some(vec!["/kubepods", "/system.slice"]),
        some(vec!["0", "1", "GPU-a", "GPU-cd"]),
        prop::collection::vec(kinds, 0..=1),
        prop::bool::weighted(0.2),
    )
        .prop_map(|(ns, pod, container, cgroup_id, prefix, gpu, kind, violations_only)| {
            let strings = |v: Vec<&str>| v.into_iter().map(String::from).collect();
            v1::EventFilter {
                namespace: strings(ns),
                pod: strings(pod),
                container: strings(container),
                cgroup_id,
                cgroup_path_prefix: strings(prefix),
                gpu: strings(gpu),
                kind,
                violations_only,
            }
        })
}

proptest! {
    /// The key decides only where the message would decide the same, and the hub's answer
    /// (from the key, or from the event decoded out of the bytes) is always the message's.
    #[test]
    fn the_key_decides_as_the_message_would(
        ev in any_event(),
        include in prop::collection::vec(any_filter(), 0..=2),
        exclude in prop::collection::vec(any_filter(), 0..=1),
    ) {
        let f = filters(include, exclude);
        let p = published(&ev);
        prop_assert_eq!(p.event(), Some(ev.clone()));
        if let Some(decided) = f.matches_key(&p.key) {
            prop_assert_eq!(decided, f.matches(&ev));
        }
        let hub = EventHub::new(HubSettings::default());
        prop_assert_eq!(hub.matches(&p, &f), f.matches(&ev));
        prop_assert_eq!(hub.undecodable(), 0);
        // No filter, or kinds only: never the message.
        let kinds = filters(vec![v1::EventFilter { kind: vec![v1::EventKind::RmFree as i32], ..Default::default() }], vec![]);
        prop_assert!(filters(vec![], vec![]).matches_key(&p.key).is_some() && kinds.matches_key(&p.key).is_some());
    }
}

#[test]
fn an_event_that_does_not_decode_is_counted_and_not_sent() {
    let hub = EventHub::new(HubSettings::default());
    let ml = filters(vec![v1::EventFilter { namespace: vec!["ml".into()], ..Default::default() }], vec![]);
    let mut p = published(&alloc(1));
    assert!(hub.matches(&p, &ml));
    p.encoded = EncodedSubscribeResponse(vec![0x0a, 0xff, 0xff].into());
    assert!(!hub.matches(&p, &ml));
    assert_eq!((hub.decoded(), hub.undecodable()), (2, 1));
    // A subscriber without filters still sends it: it never looks inside.
    assert!(hub.matches(&p, &filters(vec![], vec![])));
}

/// The bench's RM allocation with a full pod identity (`bench/src/api`): a typical event.
fn pod_event() -> v1::Event {
    let mut ev = alloc(1_764_000_000_000_000_000);
    let h = ev.header.as_mut().unwrap();
    (h.ktime_ns, h.tgid, h.pid, h.process_start_time_ns, h.cgroup_id, h.duration_ns) =
        (1_000_000, 4242, 4243, 123_456_789, 98_765, 25_000);
    h.cgroup_path = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c3d4e_5f60_7182_93a4_b5c6d7e8f901.slice/cri-containerd-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope".into();
    h.comm = "python3".into();
    h.container = Some(v1::ContainerIdentity {
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
    });
    ev.device = Some(v1::Device { kind: v1::DeviceKind::Ctl as i32, minor: 0, file_id: 0xffff_8881_0000_0000 });
    ev.fd = Some(5);
    ev.payload = Some(v1::event::Payload::RmAlloc(v1::RmAlloc {
        client: 0xc1d0_0001,
        parent: 0xcaf0_0001,
        handle: 0xcaf0_0100,
        class_id: 0x0040,
        success: true,
        bytes: 2 << 20,
        location: v1::MemoryLocation::Vidmem as i32,
        ..Default::default()
    }));
    ev
}

/// What the ring holds per event, before (the message kept next to its bytes) and now (the bytes
/// and a key). Heap blocks are counted at their requested size (the allocator's rounding and
/// headers add some 8–16 bytes to each, more blocks before than now).
#[test]
fn the_hub_holds_the_bytes_and_a_key_not_the_message() {
    let ev = pod_event();
    let p = published(&ev);
    let encoded = p.encoded.0.len();
    let h = ev.header.as_ref().unwrap();
    let c = h.container.as_ref().unwrap();
    let strings: usize = [
        &h.cgroup_path,
        &h.comm,
        &c.kind,
        &c.runtime,
        &c.container_id,
        &c.pod_uid,
        &c.qos,
        &c.namespace,
        &c.pod,
        &c.container,
        &c.owner_kind,
        &c.owner_name,
    ]
    .iter()
    .map(|s| s.len())
    .sum();
    // Then: a ring slot (an Arc) → { count, weak, seq, the message, the bytes } + the strings + the
    // encoded buffer and the `Bytes`' shared header (24 bytes, made when first shared).
    let bytes_header = 24;
    let before = size_of::<usize>()
        + 2 * size_of::<usize>()
        + size_of::<u64>()
        + size_of::<v1::Event>()
        + size_of::<EncodedSubscribeResponse>()
        + strings
        + encoded
        + bytes_header;
    // Now: the slot holds the `Published` itself.
    let now = size_of::<Published>() + encoded + bytes_header;
    println!(
        "held per event: before {before} B (message {} B in place + {strings} B of strings), now {now} B \
         ({} B in place, of which a {} B key; {encoded} B encoded)",
        size_of::<v1::Event>(),
        size_of::<Published>(),
        size_of::<EventKey>(),
    );
    assert_eq!(size_of::<EventKey>(), 32);
    assert!(size_of::<Published>() <= 72, "{}", size_of::<Published>());
    assert!(now * 2 < before, "now {now} B, before {before} B");
}

#[tokio::test]
async fn a_subscriber_that_falls_behind_learns_exactly_how_many_it_lost() {
    let hub = Arc::new(EventHub::new(HubSettings { history: 0, subscriber_buffer: 8, max_subscribers: 2 }));
    let mut sub = hub.subscribe().unwrap();
    let idle = hub.subscribe().unwrap();
    for i in 1..=100 {
        hub.publish(alloc(i));
    }
    // Issue 45 item 7: before either reads, each has lost 92 (the old hub said 0 until they read).
    assert_eq!(hub.stats().lost, 2 * 92);
    // One that goes away without ever reading keeps its loss counted.
    drop(idle);
    assert_eq!(hub.stats().lost, 2 * 92);
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
    assert_eq!(hub.stats().lost, 2 * 92, "told or not, each loss counted once");
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
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let path = dir.path().join("sub/api.sock");
        let hub = Arc::new(EventHub::new(hub));
        let serve = Arc::new(ServeState::new(MetricsRegistry::new(), HealthSettings::default()));
        let state = Arc::new(ApiState::new(hub.clone(), serve.clone(), crate::probe::nvml_only_report()));
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
        let mut c = api::connect(&self.conn).await.unwrap();
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

/// A namespace subscriber gets exactly its namespace's events and decodes only those (the key rules
/// out the others); subscribers without filters or with kinds only never decode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_filters_the_key_cannot_decide_decode_events() {
    let r = Running::start(HubSettings::default(), None).await;
    for i in 1..=30 {
        r.hub.publish(if i % 3 == 0 { alloc(i) } else { event(v1::EventKind::RmFree, 8, "web", "frontend", i) });
    }
    // Replays: the newest two "ml" events decode only as far back as needed.
    let ml = v1::EventFilter { namespace: vec!["ml".into()], ..Default::default() };
    let mut s =
        r.subscribe(v1::SubscribeRequest { include: vec![ml.clone()], number: 2, ..Default::default() }).await.unwrap();
    assert_eq!(walls(&read(&mut s, 100).await.0), vec![27, 30]);
    assert_eq!(r.hub.decoded(), 2);
    let mut all = r.subscribe(follow()).await.unwrap();
    let frees = v1::EventFilter { kind: vec![v1::EventKind::RmFree as i32], ..Default::default() };
    let mut kind_only = r.subscribe(v1::SubscribeRequest { include: vec![frees], ..follow() }).await.unwrap();
    let mut in_ml = r.subscribe(v1::SubscribeRequest { include: vec![ml], ..follow() }).await.unwrap();
    until_subscribers(&r.hub, 3).await;
    const N: u64 = 3_000;
    for i in 1..=N {
        let ev = match i % 3 {
            0 => alloc(i),
            1 => event(v1::EventKind::RmFree, 8, "web", "frontend", i),
            _ => event(v1::EventKind::RmAlloc, 9, "batch", "etl", i),
        };
        r.hub.publish(ev);
    }
    r.hub.flush();
    let (got, lost) = read(&mut all, N as usize).await;
    assert_eq!((walls(&got), lost), ((1..=N).collect(), 0));
    let (got, lost) = read(&mut kind_only, N as usize / 3).await;
    assert_eq!((walls(&got), lost), ((1..=N).step_by(3).collect(), 0));
    let (got, lost) = read(&mut in_ml, N as usize / 3).await;
    assert_eq!((walls(&got), lost), ((3..=N).step_by(3).collect(), 0));
    assert!(got.iter().all(|e| e.header.as_ref().unwrap().container.as_ref().unwrap().namespace == "ml"));
    assert_eq!(r.hub.decoded(), 2 + N / 3, "only the \"ml\" events, by the \"ml\" subscriber");
    assert_eq!(r.hub.undecodable(), 0);
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
    // Before the stalled one reads again, what it has lost is already counted.
    let counted_before = r.hub.stats().lost;
    assert!(counted_before > fast_lost, "a subscriber that does not read shows no loss: {counted_before}");
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
    assert_eq!(r.hub.stats().lost, fast_lost + lost, "each loss counted once");
    assert!(counted_before <= fast_lost + lost);
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
    let mut c = api::connect(&r.conn).await.unwrap();
    assert_eq!(c.get_snapshot(v1::GetSnapshotRequest {}).await.unwrap_err().code(), Code::Unavailable);
    let snap = tracer_core::model::AgentSnapshot { api: Some(r.hub.stats()), ..Default::default() };
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
    let mut c = api::connect(&r.conn).await.unwrap();
    assert!(c.get_status(v1::GetStatusRequest {}).await.is_ok());
    for wrong in [None, Some("wrong".to_string()), Some("s3cre".to_string())] {
        let conn = ConnectSettings { token: wrong, ..r.conn.clone() };
        let mut c = api::connect(&conn).await.unwrap();
        assert_eq!(c.get_status(v1::GetStatusRequest {}).await.unwrap_err().code(), Code::Unauthenticated);
        assert_eq!(c.subscribe(follow()).await.unwrap_err().code(), Code::Unauthenticated);
    }
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_socket_is_not_taken_over_and_a_stale_one_is_replaced() {
    let r = Running::start(HubSettings::default(), None).await;
    let ApiAddr::Unix(path) = r.conn.addr.clone() else { unreachable!() };
    let state = Arc::new(ApiState::new(r.hub.clone(), r.serve.clone(), crate::probe::nvml_only_report()));
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
    assert!(matches!(listen::serve(&settings, state.clone()).await.unwrap_err(), listen::ListenError::NotASocket(_)));
    assert!(file.exists());
    // Issue 45 item 5: a socket in a directory that does not exist is an error naming it; nothing
    // is created (only the default's /run/gpu-tracer is made).
    let nowhere = path.with_file_name("no/such/dir/api.sock");
    let settings = ListenSettings { addr: ApiAddr::Unix(nowhere.clone()), tls: None, token: None };
    let err = listen::serve(&settings, state).await.unwrap_err().to_string();
    assert!(err.contains("no directory") && err.contains("no/such/dir"), "{err}");
    assert!(!path.with_file_name("no").exists(), "no directory was made");
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_off_loopback_needs_tls_and_tls_with_a_token_works() {
    let hub = Arc::new(EventHub::new(HubSettings::default()));
    let serve = Arc::new(ServeState::new(MetricsRegistry::new(), HealthSettings::default()));
    let state = Arc::new(ApiState::new(hub.clone(), serve, crate::probe::nvml_only_report()));
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
    let mut c = api::connect(&conn).await.unwrap();
    let mut s = c.subscribe(follow()).await.unwrap().into_inner();
    until_subscribers(&hub, 1).await;
    hub_publish(&hub, alloc(5));
    assert_eq!(walls(&read(&mut s, 1).await.0), vec![5]);
    // Without the token: refused even over TLS.
    let mut c = api::connect(&ConnectSettings { token: None, ..conn.clone() }).await.unwrap();
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
    assert_eq!(tracer_core::filter::parse_kind("rm_alloc"), Ok(v1::EventKind::RmAlloc as i32));
    assert_eq!(tracer_core::filter::parse_kind("EVENT_KIND_VIOLATION"), Ok(v1::EventKind::Violation as i32));
    assert!(tracer_core::filter::parse_kind("unspecified").unwrap_err().contains("rm_alloc"));
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
    let mut api = tracer_core::config::ApiSettings::default();
    assert!(api.history_kinds().unwrap().unwrap().contains(&(v1::EventKind::Violation as i32)));
    assert!(!api.history_kinds().unwrap().unwrap().contains(&(v1::EventKind::RmControl as i32)));
    api.history_kinds = vec!["all".into()];
    assert_eq!(api.history_kinds().unwrap(), None);
    api.history_kinds = vec!["rm_allocc".into()];
    assert!(api.history_kinds().unwrap_err().to_string().contains("rm_allocc"));
}

mod profile_sessions {
    use std::time::Duration;

    use gpu_tracer_proto::{tonic::Code, v1};

    use crate::{
        export::api::profiles::request_to_spec,
        pipeline::PerEventSelection::{Cgroup, Process},
        profile::desk::union,
    };
    use tracer_core::profile::TargetSpec;

    #[test]
    fn overlapping_sessions_keep_each_selection_once_with_the_latest_deadline() {
        let a = [Cgroup(7), Process(42)];
        let b = [Cgroup(7), Cgroup(9)];
        let u = union([(&a[..], 100), (&b[..], 300)]);
        assert_eq!(u, vec![(Cgroup(7), 300), (Cgroup(9), 300), (Process(42), 100)]);
        // One session ends: its selections go, the other's stay with its own deadline.
        assert_eq!(union([(&a[..], 100)]), vec![(Cgroup(7), 100), (Process(42), 100)]);
        assert!(union([]).is_empty(), "no session: per-event mode off");
    }

    #[test]
    fn profile_requests_are_checked_before_anything_is_switched() {
        use v1::profile_request::Target as T;
        let req = |target, duration_ms| v1::ProfileRequest { target, duration_ms };
        assert_eq!(request_to_spec(&req(Some(T::Pid(4)), 1000)).unwrap(), (TargetSpec::Pid(4), Duration::from_secs(1)));
        let pod = T::Pod(v1::PodRef { namespace: "ml".into(), name: "t-0".into(), container: String::new() });
        assert_eq!(
            request_to_spec(&req(Some(pod), 5)).unwrap().0,
            TargetSpec::Pod { namespace: "ml".into(), name: "t-0".into(), container: None }
        );
        for (target, ms) in [
            (None, 1000),
            (Some(T::Pid(0)), 1000),
            (Some(T::Cgroup(String::new())), 1000),
            (Some(T::Pid(4)), 0),
            (Some(T::Pid(4)), 3_600_001),
            (Some(T::Pod(v1::PodRef { namespace: "ml".into(), ..Default::default() })), 1000),
        ] {
            let e = request_to_spec(&req(target.clone(), ms)).unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{target:?} {ms}: {e:?}");
        }
    }
}

/// Issue 45 item 1: an empty token refuses every call, with or without a header (before, a
/// request without one matched it).
#[test]
fn an_empty_bearer_token_lets_nothing_in() {
    use super::service::BearerToken;
    let with = |auth: Option<&str>| {
        let mut req = tonic::Request::new(());
        if let Some(a) = auth {
            req.metadata_mut().insert("authorization", a.parse().unwrap());
        }
        req
    };
    let empty = BearerToken::new("");
    for auth in [None, Some("Bearer "), Some("Bearer x")] {
        assert_eq!(empty.check(with(auth)).unwrap_err().code(), Code::Unauthenticated, "{auth:?}");
    }
    let t = BearerToken::new("s3cret");
    assert!(t.check(with(Some("Bearer s3cret"))).is_ok());
    assert!(t.check(with(None)).is_err());
    assert!(t.check(with(Some("Bearer s3cre"))).is_err());
}

/// Text a client could put in a request field: anything, the characters that matter to paths and
/// names, path escapes, very long values.
fn hostile_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[./a-z0-9\u{0}\n-]{0,30}",
        Just("../../../../etc".to_string()),
        Just("/kubepods.slice/../..".to_string()),
        Just("GPU-".to_string()),
        Just("x".repeat(70_000)),
        Just("\u{202e}\u{1b}]0;t\u{7}".to_string()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..Default::default() })]
    /// Issue 45: every field of `Subscribe` and `Profile` requests with hostile values (unknown and
    /// negative kinds, any text, any numbers) is served or refused with INVALID_ARGUMENT (or
    /// RESOURCE_EXHAUSTED) naming why; never a panic, never a stream that errors later.
    #[test]
    fn hostile_api_requests_are_served_or_refused_never_a_panic(
        kinds in prop::collection::vec(any::<i32>(), 0..3),
        texts in prop::collection::vec(hostile_text(), 6),
        ids in prop::collection::vec(any::<u64>(), 0..3),
        (since, number, first, follow, violations) in (any::<u64>(), any::<u64>(), any::<bool>(), any::<bool>(), any::<bool>()),
        (pid, duration, which) in (any::<u32>(), any::<u64>(), 0u8..4),
    ) {
        let filter = v1::EventFilter {
            namespace: vec![texts[0].clone()],
            pod: vec![texts[1].clone()],
            container: vec![texts[2].clone()],
            cgroup_id: ids.clone(),
            cgroup_path_prefix: vec![texts[3].clone()],
            gpu: vec![texts[4].clone()],
            kind: kinds.clone(),
            violations_only: violations,
        };
        let req = v1::SubscribeRequest {
            follow,
            since_unix_ns: since,
            number,
            first,
            include: vec![filter.clone()],
            exclude: if violations { vec![filter] } else { vec![] },
        };
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            rt.block_on(async {
                use gpu_tracer_proto::v1::gpu_tracer_server::GpuTracer as _;
                use futures::StreamExt as _;
                let hub = Arc::new(EventHub::new(HubSettings { history: 16, subscriber_buffer: 16, max_subscribers: 2 }));
                for i in 1..=20 {
                    hub_publish(&hub, alloc(i));
                }
                let serve = Arc::new(ServeState::new(MetricsRegistry::new(), HealthSettings::default()));
                let state = Arc::new(ApiState::new(hub.clone(), serve, crate::probe::nvml_only_report()));
                let svc = super::service::ApiService::new(state);
                match svc.subscribe(tonic::Request::new(req)).await {
                    Ok(stream) => {
                        let mut stream = stream.into_inner();
                        for _ in 0..20 {
                            match tokio::time::timeout(Duration::from_millis(5), stream.next()).await {
                                Ok(Some(item)) => { item.map_err(|s| format!("a stream that errors later: {s:?}"))?; }
                                Ok(None) | Err(_) => break,
                            }
                        }
                        Ok(())
                    }
                    Err(s) if matches!(s.code(), Code::InvalidArgument | Code::ResourceExhausted) && !s.message().is_empty() => Ok(()),
                    Err(s) => Err(format!("refused as {s:?}")),
                }
            })
        }));
        let outcome = outcome.map_err(|_| "Subscribe panicked".to_string()).and_then(|r| r);
        prop_assert!(outcome.is_ok(), "{:?}", outcome);

        use v1::profile_request::Target;
        let target = match which {
            0 => None,
            1 => Some(Target::Pid(pid)),
            2 => Some(Target::Cgroup(texts[5].clone())),
            _ => Some(Target::Pod(v1::PodRef { namespace: texts[0].clone(), name: texts[1].clone(), container: texts[2].clone() })),
        };
        let profile = v1::ProfileRequest { target, duration_ms: duration };
        let spec = std::panic::catch_unwind(|| super::profiles::request_to_spec(&profile));
        prop_assert!(spec.is_ok(), "Profile's request check panicked on {profile:?}");
        if let Err(s) = spec.unwrap() {
            prop_assert_eq!(s.code(), Code::InvalidArgument);
            prop_assert!(!s.message().is_empty());
        }
        // A cgroup named by text is looked up inside the cgroup2 mount or not at all.
        let enricher = crate::enrich::Enricher::new("/proc".into(), None);
        let looked = std::panic::catch_unwind(|| enricher.cgroup_id(&texts[5]));
        prop_assert!(looked.is_ok(), "the cgroup lookup panicked on {:?}", texts[5]);
    }
}
