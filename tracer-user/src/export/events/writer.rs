//! Writing the event stream: [`EventWriter`] encodes messages in one [`EventFormat`].

use std::{
    fs::File,
    io::{self, BufWriter, Write},
    path::Path,
};

use gpu_tracer_proto::{prost::Message, v1};

use super::json::to_json;

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

    /// Flushes the underlying writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// Events written so far.
    pub fn events_written(&self) -> u64 {
        self.events
    }

    /// Bytes written so far (handed to the underlying writer, not necessarily flushed).
    pub fn bytes_written(&self) -> u64 {
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
