//! The event stream a command writes: `gputracer.v1.Event`s as a length-delimited protobuf
//! stream or as JSON lines ([`EventWriter`]), and [`EventStream`] (an event limit, the first write
//! error kept, a broken pipe a normal end).
use std::{
    fs::File,
    io::{self, BufWriter, Write},
    path::Path,
};

use gpu_tracer_proto::{EncodedSubscribeResponse, prost::Message, v1};

use tracer_core::wire::events::to_json;

/// How the event stream is written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EventFormat {
    /// Length-delimited `gputracer.v1.Event` messages (a varint length, then the message).
    #[default]
    Protobuf,
    /// One [`to_json`] object per line.
    JsonLines,
}

/// Writes events in one [`EventFormat`] and counts what it wrote.
pub struct EventWriter<W: Write> {
    out: W,
    format: EventFormat,
    /// Reused encoding buffer, so each event is one `write_all`.
    buf: Vec<u8>,
    events: u64,
    bytes: u64,
}

impl EventWriter<Box<dyn Write + Send>> {
    /// A buffered writer to the file at `path` (created or truncated), or to stdout when `path` is
    /// `None` or `-`.
    pub fn to_path(path: Option<&Path>, format: EventFormat) -> io::Result<Self> {
        let out: Box<dyn Write + Send> = match path {
            Some(p) if p != Path::new("-") => Box::new(BufWriter::new(File::create(p)?)),
            _ => Box::new(BufWriter::new(io::stdout())),
        };
        Ok(EventWriter::new(out, format))
    }
}

impl<W: Write> EventWriter<W> {
    /// A writer to `out` (which it does not buffer itself).
    pub fn new(out: W, format: EventFormat) -> Self {
        EventWriter { out, format, buf: Vec::with_capacity(256), events: 0, bytes: 0 }
    }

    /// Writes one event. On error the stream may end with a partial event.
    pub fn write(&mut self, ev: &v1::Event) -> io::Result<()> {
        self.buf.clear();
        match self.format {
            EventFormat::Protobuf => {
                // Writing into a Vec only fails when it cannot grow, which aborts first.
                ev.encode_length_delimited(&mut self.buf).map_err(io::Error::other)?
            }
            EventFormat::JsonLines => {
                serde_json::to_writer(&mut self.buf, &to_json(ev))?;
                self.buf.push(b'\n');
            }
        }
        self.out.write_all(&self.buf)?;
        self.events += 1;
        self.bytes += self.buf.len() as u64;
        Ok(())
    }

    /// Writes one event as the agent's hub encoded it (`EventHub::encode`, the bytes its gRPC
    /// subscribers receive). In protobuf the bytes are written as they are — the stream's framing
    /// is a view of the same buffer — so an event is never encoded twice; JSON decodes it.
    pub fn write_encoded(&mut self, ev: &EncodedSubscribeResponse) -> io::Result<()> {
        let not_an_event = || io::Error::new(io::ErrorKind::InvalidData, "a SubscribeResponse that holds no event");
        match self.format {
            EventFormat::Protobuf => {
                let framed = ev.event_length_delimited().ok_or_else(not_an_event)?;
                self.out.write_all(&framed)?;
                self.events += 1;
                self.bytes += framed.len() as u64;
                Ok(())
            }
            EventFormat::JsonLines => {
                let event = ev.event().ok_or_else(not_an_event)?;
                self.write(&event)
            }
        }
    }

    /// Flushes the underlying writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// Events written so far.
    pub(crate) fn events_written(&self) -> u64 {
        self.events
    }

    #[cfg(test)]
    /// Bytes written so far (handed to the underlying writer, not necessarily flushed).
    pub(crate) fn bytes_written(&self) -> u64 {
        self.bytes
    }

    /// The format this writer writes.
    pub fn format(&self) -> EventFormat {
        self.format
    }

    /// The underlying writer (not flushed).
    pub fn into_inner(self) -> W {
        self.out
    }
}

/// The event stream a command writes: an [`EventWriter`] with a limit on the number of events, that
/// stops at the first write error and keeps it for [`finish`](EventStream::finish).
///
/// Every path that adds events to the stream (decoded events, launch batches, guardrail violations)
/// goes through [`emit`](EventStream::emit), so they share one limit, one count and one error.
pub struct EventStream<W: Write> {
    writer: EventWriter<W>,
    limit: u64,
    error: Option<io::Error>,
}

impl<W: Write> EventStream<W> {
    /// A stream to `writer` that takes at most `limit` events (`None`: no limit).
    pub fn new(writer: EventWriter<W>, limit: Option<u64>) -> Self {
        EventStream { writer, limit: limit.unwrap_or(u64::MAX), error: None }
    }

    /// Writes `msg` unless the stream is [done](EventStream::is_done). Returns whether it was
    /// written; a write error is kept (and ends the stream) rather than returned.
    pub fn emit(&mut self, msg: &v1::Event) -> bool {
        if self.is_done() {
            return false;
        }
        match self.writer.write(msg) {
            Ok(()) => true,
            Err(e) => {
                self.error = Some(e);
                false
            }
        }
    }

    /// [`emit`](EventStream::emit) for an event the agent's hub encoded
    /// ([`EventWriter::write_encoded`]).
    pub fn emit_encoded(&mut self, ev: &EncodedSubscribeResponse) -> bool {
        if self.is_done() {
            return false;
        }
        match self.writer.write_encoded(ev) {
            Ok(()) => true,
            Err(e) => {
                self.error = Some(e);
                false
            }
        }
    }

    #[cfg(test)]
    /// [`emit`](EventStream::emit) for a message built only if the stream still takes events, so a
    /// finished stream costs its callers nothing (not even the lookups the message needs).
    pub(crate) fn emit_with(&mut self, build: impl FnOnce() -> v1::Event) -> bool {
        !self.is_done() && self.emit(&build())
    }

    /// Whether the stream takes no more events: the limit is reached or a write failed.
    pub fn is_done(&self) -> bool {
        self.error.is_some() || self.written() >= self.limit
    }

    /// Events written so far.
    pub fn written(&self) -> u64 {
        self.writer.events_written()
    }

    /// Flushes the stream and returns the number of events written, or the first write error. A
    /// broken pipe (the reader went away, as in `gpu-tracer events | head -1`) is a normal end.
    pub fn finish(mut self) -> io::Result<u64> {
        let flushed = self.writer.flush();
        match self.error.map_or(flushed, Err) {
            Err(e) if e.kind() != io::ErrorKind::BrokenPipe => Err(e),
            _ => Ok(self.writer.events_written()),
        }
    }
}

#[cfg(test)]
mod tests;
