use super::v1::{self, event::Payload};
use super::*;

fn rm_alloc() -> v1::Event {
    v1::Event {
        header: Some(v1::Header {
            kind: v1::EventKind::RmAlloc as i32,
            ktime_ns: 1_234_567_890,
            wall_time_unix_ns: 1_790_000_000_000_000_000,
            tgid: 4242,
            pid: 4243,
            process_start_time_ns: 99_000_000,
            cgroup_id: 7777,
            cgroup_path: "/kubepods.slice/kubepods-pod1234.slice/cri-containerd-abc.scope".into(),
            comm: "python3".into(),
            duration_ns: 15_000,
            syscall_ret: 0,
            container: Some(v1::ContainerIdentity {
                kind: "container".into(),
                runtime: "containerd".into(),
                container_id: "abc".into(),
                pod_uid: "1234".into(),
                namespace: "ml".into(),
                pod: "train-0".into(),
                container: "main".into(),
                labels: [("team".to_string(), "ml".to_string())].into(),
                allocated_gpus: vec!["GPU-1::2".into()],
                allocations_known: true,
                ..Default::default()
            }),
        }),
        device: Some(v1::Device { kind: v1::DeviceKind::Ctl as i32, minor: 0, file_id: 0xdead_beef }),
        fd: Some(5),
        payload: Some(Payload::RmAlloc(v1::RmAlloc {
            client: 0xc1d0_0001,
            parent: 0x5c00_0002,
            handle: 0x5c00_0010,
            class_id: 0x40,
            status: 0,
            success: true,
            bytes: 2 << 20,
            location: v1::MemoryLocation::Vidmem as i32,
            memory_kind: v1::MemoryKind::Physical as i32,
            form: v1::RmAllocForm::Nvos64 as i32,
        })),
    }
}

fn process_exit() -> v1::Event {
    v1::Event {
        header: Some(v1::Header { kind: v1::EventKind::ProcessExit as i32, tgid: 4242, ..Default::default() }),
        device: None,
        fd: None,
        payload: Some(Payload::ProcessExit(v1::ProcessExit {})),
    }
}

#[test]
fn length_delimited_stream_round_trips() {
    let events = vec![rm_alloc(), process_exit(), rm_alloc()];
    let mut buf = Vec::new();
    for e in &events {
        e.encode_length_delimited(&mut buf).unwrap();
    }
    let back: Vec<_> = read_stream(&buf).collect::<Result<_, _>>().unwrap();
    assert_eq!(back, events);
    // An absent fd stays absent (proto3 `optional`), a present fd 0 would stay Some(0).
    assert_eq!(back[1].fd, None);
    assert_eq!(back[1].header.as_ref().unwrap().kind(), v1::EventKind::ProcessExit);
}

#[test]
fn truncated_stream_reports_an_error_and_stops() {
    let mut buf = Vec::new();
    rm_alloc().encode_length_delimited(&mut buf).unwrap();
    rm_alloc().encode_length_delimited(&mut buf).unwrap();
    buf.truncate(buf.len() - 3);
    let results: Vec<_> = read_stream(&buf).collect();
    assert_eq!(results.len(), 2);
    assert!(results[0].is_ok());
    assert!(results[1].is_err());
}

#[test]
fn device_kind_numbers_match_the_names_in_the_proto() {
    // The proto documents that these equal tracer-common's device_kind constants.
    assert_eq!(v1::DeviceKind::Ctl as i32, 1);
    assert_eq!(v1::DeviceKind::Caps as i32, 6);
    assert_eq!(v1::DeviceKind::from_str_name("DEVICE_KIND_UVM"), Some(v1::DeviceKind::Uvm));
}

#[cfg(feature = "serde")]
#[test]
fn serde_json_round_trips() {
    let e = rm_alloc();
    let json = serde_json::to_string(&e).unwrap();
    let back: v1::Event = serde_json::from_str(&json).unwrap();
    assert_eq!(back, e);
}

/// `SubscribeResponse { event }` is `0x0a`, the event's length and the event: the `events` stream's
/// framing is a view of it.
#[cfg(feature = "api")]
#[test]
fn an_encoded_response_holds_the_length_delimited_event() {
    use crate::EncodedSubscribeResponse;
    for ev in [rm_alloc(), process_exit()] {
        let r = v1::SubscribeResponse { response: Some(v1::subscribe_response::Response::Event(ev.clone())) };
        let enc = EncodedSubscribeResponse::new(&r);
        let framed = enc.event_length_delimited().unwrap();
        assert_eq!(&framed[..], &ev.encode_length_delimited_to_vec()[..]);
        // A view of the same buffer, not a copy.
        assert_eq!(framed.as_ptr(), enc.0[1..].as_ptr());
    }
    let lost = v1::SubscribeResponse {
        response: Some(v1::subscribe_response::Response::LostEvents(v1::LostEvents { count: 3, ..Default::default() })),
    };
    assert_eq!(EncodedSubscribeResponse::new(&lost).event_length_delimited(), None);
    assert_eq!(EncodedSubscribeResponse(vec![0x0a, 5, 1].into()).event_length_delimited(), None, "short");
    assert_eq!(EncodedSubscribeResponse(vec![0x0a, 0x80].into()).event_length_delimited(), None, "bad varint");
    assert_eq!(EncodedSubscribeResponse(Default::default()).event_length_delimited(), None);
}

/// `of_event` writes exactly what prost writes for `SubscribeResponse { event }`, into a buffer of
/// exactly that size: small and empty events, and ones whose length takes two and three varint
/// bytes.
#[cfg(feature = "api")]
#[test]
fn of_event_is_prosts_encoding() {
    use crate::EncodedSubscribeResponse;
    let long = |n: usize| {
        let mut ev = rm_alloc();
        if let Some(h) = ev.header.as_mut() {
            h.cgroup_path = "x".repeat(n);
        }
        ev
    };
    for ev in [rm_alloc(), process_exit(), v1::Event::default(), long(200), long(20_000)] {
        let want = v1::SubscribeResponse { response: Some(v1::subscribe_response::Response::Event(ev.clone())) }
            .encode_to_vec();
        let got = EncodedSubscribeResponse::of_event(&ev);
        assert_eq!(&got.0[..], &want[..]);
        assert_eq!(got.event(), Some(ev));
    }
}
