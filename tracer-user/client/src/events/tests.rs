use gpu_tracer_proto::v1;
use serde_json::Value;

use super::*;
use tracer_core::{
    fixtures::{enrichment, events},
    wire::events::{to_json, to_proto},
};

#[test]
fn protobuf_stream_reads_back() {
    let msgs: Vec<_> = events().iter().map(|ev| to_proto(ev, &enrichment())).collect();
    let mut w = EventWriter::new(Vec::new(), EventFormat::Protobuf);
    for m in &msgs {
        w.write(m).unwrap();
    }
    w.flush().unwrap();
    assert_eq!(w.events_written(), msgs.len() as u64);
    let (n, buf) = (w.bytes_written(), w.into_inner());
    assert_eq!(n, buf.len() as u64);
    let back: Vec<_> = gpu_tracer_proto::read_stream(&buf).collect::<Result<_, _>>().unwrap();
    assert_eq!(back, msgs);
}

/// An event the hub encoded is written as the same bytes `write` would make (protobuf: a view of
/// the hub's buffer, not a second encoding) and the same JSON; a LostEvents is refused.
#[test]
fn hub_encoded_events_write_as_the_messages_do() {
    let msgs: Vec<_> = events().iter().map(|ev| to_proto(ev, &enrichment())).collect();
    for format in [EventFormat::Protobuf, EventFormat::JsonLines] {
        let (mut a, mut b) = (EventWriter::new(Vec::new(), format), EventWriter::new(Vec::new(), format));
        for m in &msgs {
            a.write(m).unwrap();
            b.write_encoded(&EncodedSubscribeResponse::new(&v1::SubscribeResponse {
                response: Some(v1::subscribe_response::Response::Event(m.clone())),
            }))
            .unwrap();
        }
        assert_eq!((a.events_written(), a.bytes_written()), (b.events_written(), b.bytes_written()));
        assert_eq!(a.into_inner(), b.into_inner(), "{format:?}");
    }
    let lost = EncodedSubscribeResponse::new(&v1::SubscribeResponse {
        response: Some(v1::subscribe_response::Response::LostEvents(Default::default())),
    });
    let mut w = EventWriter::new(Vec::new(), EventFormat::Protobuf);
    assert_eq!(w.write_encoded(&lost).unwrap_err().kind(), io::ErrorKind::InvalidData);
    assert_eq!(w.events_written(), 0);
}

#[test]
fn json_lines_one_object_per_event() {
    let msgs: Vec<_> = events().iter().map(|ev| to_proto(ev, &enrichment())).collect();
    let mut w = EventWriter::new(Vec::new(), EventFormat::JsonLines);
    for m in &msgs {
        w.write(m).unwrap();
    }
    let (n, buf) = (w.bytes_written(), w.into_inner());
    assert_eq!(n, buf.len() as u64);
    let text = String::from_utf8(buf).unwrap();
    let lines: Vec<_> = text.lines().collect();
    assert_eq!(lines.len(), msgs.len());
    for (line, m) in lines.iter().zip(&msgs) {
        let v: Value = serde_json::from_str(line).unwrap();
        assert_eq!(v, to_json(m));
    }
}

#[test]
fn to_path_writes_a_file() {
    let path = std::env::temp_dir().join(format!("gpu-tracer-export-test-{}.pb", std::process::id()));
    let msgs: Vec<_> = events().iter().take(3).map(|ev| to_proto(ev, &enrichment())).collect();
    {
        let mut w = EventWriter::to_path(Some(&path), EventFormat::Protobuf).unwrap();
        assert_eq!(w.format(), EventFormat::Protobuf);
        for m in &msgs {
            w.write(m).unwrap();
        }
        w.flush().unwrap();
    }
    let buf = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let back: Vec<_> = gpu_tracer_proto::read_stream(&buf).collect::<Result<_, _>>().unwrap();
    assert_eq!(back, msgs);
}

/// A writer that takes `room` bytes, then fails every write and flush with `kind`; it counts the
/// calls it gets.
struct Failing {
    room: usize,
    kind: io::ErrorKind,
    taken: Vec<u8>,
    writes: usize,
}

impl Failing {
    fn new(room: usize, kind: io::ErrorKind) -> Self {
        Failing { room, kind, taken: Vec::new(), writes: 0 }
    }
}

impl Write for Failing {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.writes += 1;
        if self.room == 0 {
            return Err(self.kind.into());
        }
        let n = b.len().min(self.room);
        self.room -= n;
        self.taken.extend_from_slice(&b[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.room == 0 { Err(self.kind.into()) } else { Ok(()) }
    }
}

fn messages() -> Vec<v1::Event> {
    events().iter().map(|ev| to_proto(ev, &enrichment())).collect()
}

#[test]
fn stream_honours_its_limit_exactly() {
    let msgs = messages();
    assert!(msgs.len() > 3);
    let mut out = Vec::new();
    let mut s = EventStream::new(EventWriter::new(&mut out, EventFormat::Protobuf), Some(3));
    let emitted: Vec<bool> = msgs.iter().map(|m| s.emit(m)).collect();
    assert_eq!(emitted.iter().filter(|&&e| e).count(), 3);
    assert!(emitted[..3].iter().all(|&e| e), "the first three are written");
    assert!(s.is_done());
    assert_eq!(s.written(), 3);
    assert!(!s.emit_with(|| panic!("a finished stream builds no message")));
    assert_eq!(s.finish().unwrap(), 3);
    let back: Vec<_> = gpu_tracer_proto::read_stream(&out).collect::<Result<_, _>>().unwrap();
    assert_eq!(back, msgs[..3]);
}

#[test]
fn stream_without_limit_writes_everything() {
    let msgs = messages();
    let mut out = Vec::new();
    let mut s = EventStream::new(EventWriter::new(&mut out, EventFormat::JsonLines), None);
    for m in &msgs {
        assert!(s.emit_with(|| m.clone()));
    }
    assert!(!s.is_done());
    assert_eq!(s.written(), msgs.len() as u64);
    assert_eq!(s.finish().unwrap(), msgs.len() as u64);
    assert_eq!(String::from_utf8(out).unwrap().lines().count(), msgs.len());
    // A limit of zero takes nothing.
    let mut s = EventStream::new(EventWriter::new(Vec::new(), EventFormat::Protobuf), Some(0));
    assert!(s.is_done() && !s.emit(&msgs[0]));
    assert_eq!(s.finish().unwrap(), 0);
}

#[test]
fn stream_stops_at_an_io_error_and_reports_it() {
    let msgs = messages();
    let one = msgs[0].encode_length_delimited_to_vec().len();
    // Room for the first message and part of the second.
    let mut w = Failing::new(one + 1, io::ErrorKind::StorageFull);
    let mut s = EventStream::new(EventWriter::new(&mut w, EventFormat::Protobuf), None);
    assert!(s.emit(&msgs[0]));
    assert!(!s.is_done());
    assert!(!s.emit(&msgs[1]), "the failed write does not count");
    assert!(s.is_done());
    assert_eq!(s.written(), 1);
    for m in &msgs[2..] {
        assert!(!s.emit(m));
    }
    let err = s.finish().unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::StorageFull);
    // Nothing was written after the error (the finish's flush aside).
    assert_eq!(w.writes, 3, "first message, the failing one, and nothing more");
    assert_eq!(w.taken.len(), one + 1);
}

#[test]
fn stream_reports_a_failed_final_flush() {
    let msgs = messages();
    let mut w = Failing::new(0, io::ErrorKind::PermissionDenied);
    let mut s = EventStream::new(EventWriter::new(BufWriter::new(&mut w), EventFormat::Protobuf), None);
    // Buffered: the writes succeed, the flush does not.
    assert!(s.emit(&msgs[0]));
    assert_eq!(s.written(), 1);
    assert_eq!(s.finish().unwrap_err().kind(), io::ErrorKind::PermissionDenied);
}

#[test]
fn stream_ends_normally_on_a_broken_pipe() {
    let msgs = messages();
    // Unbuffered: the write that meets the closed pipe ends the stream.
    let mut w = Failing::new(0, io::ErrorKind::BrokenPipe);
    let mut s = EventStream::new(EventWriter::new(&mut w, EventFormat::JsonLines), Some(10));
    assert!(!s.emit(&msgs[0]));
    assert!(s.is_done());
    assert_eq!(s.finish().unwrap(), 0);
    // Buffered, as the command writes: the pipe closes after some events; the error shows at a
    // write that spills the buffer and again at the final flush. Neither is an error.
    let mut all = EventWriter::new(Vec::new(), EventFormat::JsonLines);
    msgs.iter().for_each(|m| all.write(m).unwrap());
    let total = all.bytes_written() as usize;
    let mut w = Failing::new(total / 2, io::ErrorKind::BrokenPipe);
    let buffered = BufWriter::with_capacity(total / 4, &mut w);
    let mut s = EventStream::new(EventWriter::new(buffered, EventFormat::JsonLines), None);
    let written = msgs.iter().take_while(|m| s.emit(m)).count() as u64;
    assert!(s.is_done());
    assert!(written >= 1 && written < msgs.len() as u64);
    assert_eq!(s.written(), written);
    assert_eq!(s.finish().unwrap(), written);
}
