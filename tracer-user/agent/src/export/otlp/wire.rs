//! OTLP metric export requests written as protobuf bytes, in one pass, with no message structs.
//!
//! An export at 8 GPUs × 100 containers is ~27,000 points whose attributes are strings; built as
//! `opentelemetry-proto` messages, every attribute of every point is two allocated strings that
//! are encoded, copied by the transport and freed (~40 % of the export's CPU in malloc and free,
//! `docs/benchmarks.md` §9). Here the builder writes each point's attributes once, as the bytes
//! they are on the wire, into an arena ([`Point`]); the [`RequestWriter`] lays the points out as
//! `ExportMetricsServiceRequest` bodies of at most `max_points` points (a metric with more is
//! split across requests with its name, unit and kind on every part) that go to the transport as
//! they are (`Bytes`: gRPC copies them once into its frame, HTTP sends them as the body).
//!
//! The bytes are what prost writes for the same messages (fields in tag order, proto3 defaults
//! left out), so a collector decodes exactly what the struct-built requests held; the tests
//! decode them with `opentelemetry-proto` and compare them with prost's encoding of the same
//! messages.
//!
//! The messages, outermost first (field numbers from `opentelemetry/proto`):
//! `ExportMetricsServiceRequest { resource_metrics = 1 }`, `ResourceMetrics { resource = 1,
//! scope_metrics = 2 }`, `ScopeMetrics { scope = 1, metrics = 2 }`, `Metric { name = 1,
//! description = 2, unit = 3, gauge = 5 | sum = 7 }`, `Gauge { data_points = 1 }`, `Sum {
//! data_points = 1, aggregation_temporality = 2, is_monotonic = 3 }`, `NumberDataPoint {
//! start_time_unix_nano = 2 (fixed64), time_unix_nano = 3 (fixed64), as_double = 4 (double) |
//! as_int = 6 (sfixed64), attributes = 7 }`, `KeyValue { key = 1, value = 2 }`, `AnyValue {
//! string_value = 1 | bool_value = 2 }`.
use std::collections::VecDeque;

use bytes::Bytes;
use opentelemetry_proto::tonic::{common::v1::InstrumentationScope, resource::v1::Resource};
use prost::{
    Message as _,
    encoding::{encode_varint, encoded_len_varint},
};

/// The key byte of field `field` (1..=15) with wire type LEN.
const fn len_key(field: u8) -> u8 {
    field << 3 | 2
}

/// The key byte of field `field` (1..=15) with wire type I64 (fixed64, sfixed64, double).
const fn i64_key(field: u8) -> u8 {
    field << 3 | 1
}

/// The key byte of field `field` (1..=15) with wire type VARINT.
const fn varint_key(field: u8) -> u8 {
    field << 3
}

/// `AggregationTemporality::Cumulative`.
const CUMULATIVE: u8 = 2;

/// Bytes of a LEN field (one-byte key) whose content is `len` bytes.
fn field_len(len: usize) -> usize {
    1 + encoded_len_varint(len as u64) + len
}

/// Bytes of an optional string field (proto3: left out when empty).
fn str_field_len(s: &str) -> usize {
    if s.is_empty() { 0 } else { field_len(s.len()) }
}

/// Append `v` as a varint (inline for the one- and two-byte lengths nearly all are).
#[inline(always)]
fn put_varint(buf: &mut Vec<u8>, v: usize) {
    if v < 0x80 {
        buf.push(v as u8);
    } else if v < 0x4000 {
        buf.extend_from_slice(&[v as u8 | 0x80, (v >> 7) as u8]);
    } else {
        encode_varint(v as u64, buf);
    }
}

#[inline(always)]
fn put_len(buf: &mut Vec<u8>, field: u8, len: usize) {
    buf.push(len_key(field));
    put_varint(buf, len);
}

#[inline(always)]
fn put_str(buf: &mut Vec<u8>, field: u8, s: &str) {
    if !s.is_empty() {
        put_len(buf, field, s.len());
        buf.extend_from_slice(s.as_bytes());
    }
}

/// Append a string attribute of a data point (`attributes = 7`, a `KeyValue` whose value is an
/// `AnyValue` string) to `buf`; returns where its key's and its value's bytes start.
pub(super) fn put_attribute(buf: &mut Vec<u8>, key: &str, value: &str) -> (usize, usize) {
    // AnyValue.string_value is in a oneof: written even when empty.
    let any = field_len(value.len());
    put_len(buf, 7, str_field_len(key) + field_len(any));
    let key_at = buf.len() + if key.is_empty() { 0 } else { 1 + encoded_len_varint(key.len() as u64) };
    put_str(buf, 1, key);
    put_len(buf, 2, any);
    put_len(buf, 1, value.len());
    let value_at = buf.len();
    buf.extend_from_slice(value.as_bytes());
    (key_at, value_at)
}

/// Append a boolean attribute of a data point (`AnyValue.bool_value = 2`).
pub(super) fn put_bool_attribute(buf: &mut Vec<u8>, key: &str, value: bool) {
    put_len(buf, 7, str_field_len(key) + field_len(2));
    put_str(buf, 1, key);
    put_len(buf, 2, 2);
    buf.push(varint_key(2));
    buf.push(u8::from(value));
}

/// A value of a point: exact integers for byte counts, doubles otherwise.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Num {
    Int(u64),
    Float(f64),
}

impl Num {
    pub(super) fn add(&mut self, other: Num) {
        *self = match (*self, other) {
            (Num::Int(a), Num::Int(b)) => Num::Int(a.saturating_add(b)),
            (a, b) => Num::Float(a.as_f64() + b.as_f64()),
        }
    }

    fn as_f64(self) -> f64 {
        match self {
            Num::Int(i) => i as f64,
            Num::Float(f) => f,
        }
    }
}

/// One data point: its attributes (`start..end` of the arena the metric is written from, already
/// encoded by [`put_attribute`]) and value.
#[derive(Clone, Copy, Debug)]
pub(super) struct Point {
    pub start: u32,
    pub end: u32,
    pub value: Num,
}

/// How a metric's points are reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Instrument {
    Gauge,
    /// A monotonic cumulative sum.
    Counter,
    /// A non-monotonic cumulative sum.
    UpDownCounter,
}

/// What every part of a metric repeats.
#[derive(Clone, Copy, Debug)]
pub(super) struct MetricHead<'a> {
    pub name: &'a str,
    pub description: &'a str,
    pub unit: &'a str,
    pub kind: Instrument,
    /// `start_time_unix_nano` of every point (0: left out).
    pub start: u64,
    /// `time_unix_nano` of every point.
    pub time: u64,
}

impl MetricHead<'_> {
    /// Bytes of one point's `NumberDataPoint` (without its own key and length).
    fn point_len(&self, p: &Point) -> usize {
        let times = if self.start != 0 { 9 } else { 0 } + if self.time != 0 { 9 } else { 0 };
        times + 9 + (p.end - p.start) as usize
    }
}

/// Where a request stood, to go back to when a source fails half way ([`RequestWriter::rollback`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct Checkpoint {
    ready: usize,
    len: usize,
    points: usize,
}

/// Lays out metrics as `ExportMetricsServiceRequest` bodies of at most `max_points` points each.
///
/// Each body is written after room for its header (the resource and scope, and the lengths of
/// the messages around the metrics, known only at the end): [`take`](Self::take) writes the
/// header into the end of that room and hands out the body from there, so nothing is copied.
#[derive(Debug)]
pub struct RequestWriter {
    /// The encoded `Resource` and `InstrumentationScope` every request carries.
    resource: Vec<u8>,
    scope: Vec<u8>,
    /// Bytes kept free at the start of every body for its header.
    room: usize,
    max_points: usize,
    /// The request being filled: `room` bytes, then its metrics.
    buf: Vec<u8>,
    points: usize,
    /// Full requests (metrics only; their headers are written when they are taken).
    ready: VecDeque<(Vec<u8>, usize)>,
    /// The size of the last request, to size the next one's buffer once.
    last_len: usize,
    /// Buffers of requests sent, to write the next ones in ([`recycle`](Self::recycle)): an
    /// export does not fault in fresh pages for every request.
    spare: Vec<Vec<u8>>,
}

/// Buffers [`RequestWriter::recycle`] keeps at most.
const SPARE_BUFFERS: usize = 2;

impl RequestWriter {
    /// Requests with `resource` and `scope`, at most `max_points` points each (`usize::MAX`: one
    /// request whatever its size).
    pub fn new(resource: &Resource, scope: &InstrumentationScope, max_points: usize) -> Self {
        let (resource, scope) = (resource.encode_to_vec(), scope.encode_to_vec());
        // Each of the three lengths around the metrics is a varint of at most 10 bytes.
        let room = field_len(resource.len()) + field_len(scope.len()) + 2 * (1 + 10);
        let mut w = RequestWriter {
            resource,
            scope,
            room,
            max_points: max_points.max(1),
            buf: Vec::new(),
            points: 0,
            ready: VecDeque::new(),
            last_len: 0,
            spare: Vec::new(),
        };
        w.buf = w.fresh();
        w
    }

    fn fresh(&mut self) -> Vec<u8> {
        let mut v = self.spare.pop().unwrap_or_default();
        v.clear();
        v.reserve(self.room + self.last_len);
        v.resize(self.room, 0);
        v
    }

    /// Give back the body of a request that was sent ([`take`](Self::take)): when nothing else
    /// holds it, its buffer is written in again.
    pub(crate) fn recycle(&mut self, body: Bytes) {
        if self.spare.len() < SPARE_BUFFERS
            && let Ok(mut b) = body.try_into_mut()
        {
            // Empty first: a BytesMut made a Vec moves its bytes to the front.
            b.clear();
            self.spare.push(b.into());
        }
    }

    /// Write one metric whose points are `points` (their attributes in `arena`): in the request
    /// being filled, and in the next ones for what does not fit.
    pub(super) fn metric(&mut self, head: &MetricHead<'_>, arena: &[u8], points: &[Point]) {
        let mut done = 0;
        while done < points.len() {
            if self.points >= self.max_points {
                self.close();
            }
            let n = (points.len() - done).min(self.max_points - self.points);
            self.write_metric(head, arena, &points[done..done + n]);
            self.points += n;
            done += n;
        }
    }

    fn write_metric(&mut self, head: &MetricHead<'_>, arena: &[u8], points: &[Point]) {
        let points_len: usize = points.iter().map(|p| field_len(head.point_len(p))).sum();
        let (data_field, data_len) = match head.kind {
            Instrument::Gauge => (5, points_len),
            // aggregation_temporality, and is_monotonic when true (a proto3 default otherwise).
            Instrument::Counter => (7, points_len + 4),
            Instrument::UpDownCounter => (7, points_len + 2),
        };
        let metric_len =
            str_field_len(head.name) + str_field_len(head.description) + str_field_len(head.unit) + field_len(data_len);
        let buf = &mut self.buf;
        buf.reserve(field_len(metric_len));
        // ScopeMetrics.metrics = 2.
        put_len(buf, 2, metric_len);
        put_str(buf, 1, head.name);
        put_str(buf, 2, head.description);
        put_str(buf, 3, head.unit);
        put_len(buf, data_field, data_len);
        for p in points {
            put_len(buf, 1, head.point_len(p));
            if head.start != 0 {
                buf.push(i64_key(2));
                buf.extend_from_slice(&head.start.to_le_bytes());
            }
            if head.time != 0 {
                buf.push(i64_key(3));
                buf.extend_from_slice(&head.time.to_le_bytes());
            }
            match p.value {
                Num::Float(f) => {
                    buf.push(i64_key(4));
                    buf.extend_from_slice(&f.to_le_bytes());
                }
                Num::Int(i) => {
                    buf.push(i64_key(6));
                    buf.extend_from_slice(&i64::try_from(i).unwrap_or(i64::MAX).to_le_bytes());
                }
            }
            buf.extend_from_slice(&arena[p.start as usize..p.end as usize]);
        }
        if head.kind != Instrument::Gauge {
            buf.extend_from_slice(&[varint_key(2), CUMULATIVE]);
            if head.kind == Instrument::Counter {
                buf.extend_from_slice(&[varint_key(3), 1]);
            }
        }
    }

    /// The request being filled is full: queue it and start the next.
    fn close(&mut self) {
        if self.points == 0 {
            return;
        }
        self.last_len = self.last_len.max(self.buf.len() - self.room);
        let next = self.fresh();
        self.ready.push_back((std::mem::replace(&mut self.buf, next), self.points));
        self.points = 0;
    }

    /// Where the requests stand now.
    pub(super) fn checkpoint(&self) -> Checkpoint {
        Checkpoint { ready: self.ready.len(), len: self.buf.len(), points: self.points }
    }

    /// Forget everything written since `cp` (requests queued since included). Requests taken
    /// since are not given back: take only after a part is complete.
    pub(super) fn rollback(&mut self, cp: Checkpoint) {
        if self.ready.len() > cp.ready {
            self.ready.truncate(cp.ready + 1);
            if let Some((buf, _)) = self.ready.pop_back() {
                self.buf = buf;
            }
        }
        self.buf.truncate(cp.len.max(self.room));
        self.points = cp.points;
    }

    /// The oldest full request, ready to send: its body and points.
    pub(crate) fn take(&mut self) -> Option<(Bytes, usize)> {
        let (buf, points) = self.ready.pop_front()?;
        Some((self.finish_body(buf), points))
    }

    /// Close the request being filled (if it has points) and take the oldest request; call until
    /// `None` at the end of an export.
    pub fn take_last(&mut self) -> Option<(Bytes, usize)> {
        self.close();
        self.take()
    }

    /// Write the header of `buf` (metrics after `room` bytes) into the end of its room.
    fn finish_body(&self, mut buf: Vec<u8>) -> Bytes {
        let metrics = buf.len() - self.room;
        let scope_metrics = field_len(self.scope.len()) + metrics;
        let resource_metrics = field_len(self.resource.len()) + field_len(scope_metrics);
        let mut head = Vec::with_capacity(self.room);
        put_len(&mut head, 1, resource_metrics);
        put_len(&mut head, 1, self.resource.len());
        head.extend_from_slice(&self.resource);
        put_len(&mut head, 2, scope_metrics);
        put_len(&mut head, 1, self.scope.len());
        head.extend_from_slice(&self.scope);
        let at = self.room - head.len();
        buf[at..self.room].copy_from_slice(&head);
        let mut body = Bytes::from(buf);
        bytes::Buf::advance(&mut body, at);
        body
    }
}
