//! The `:authority` that standard gRPC clients send over a Unix socket, made one the server takes.
//!
//! gRPC C-core (Python's grpcio, and everything built on it) sends the percent-encoded socket path
//! (`%2Frun%2Fgpu-tracer%2Fapi.sock`) as the HTTP/2 `:authority` of a `unix:` target, grpcurl
//! (`-unix`) the path itself, grpc-java the path too. Neither is an RFC 3986 authority, and h2,
//! under tonic, refuses such a request outright with `RST_STREAM(PROTOCOL_ERROR)` before any of our
//! code runs (hyperium/h2#487, open since 2020). The server never uses the authority (the socket's
//! mode is its access control), so on the Unix socket the agent reads each connection through
//! [`AuthorityFix`]: it follows the client's HTTP/2 frames, decodes every request's header block
//! (HPACK, with the client's dynamic table, `loona-hpack`), replaces an authority that does not
//! parse as one by `localhost` (what grpc-go sends there), and passes the block on re-encoded
//! without compression state (each field a literal, never indexed: h2's decoder then needs no
//! table of ours). Every other frame, and everything the server writes, passes as it is.
//!
//! Anything it cannot follow (a malformed frame or header block, a block over
//! [`MAX_BLOCK`] bytes, a frame over [`MAX_FRAME`]) is passed on from there as it came: h2 then
//! answers it as it would have, with a connection error. TCP connections are not read through
//! this (their clients send a host name).

use std::{
    io,
    pin::Pin,
    task::{Context, Poll, ready},
};

use loona_hpack::Decoder;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// The client connection preface (`PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`), passed on first.
const PREFACE_LEN: usize = 24;
const FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The largest frame the server accepts (HTTP/2's default `SETTINGS_MAX_FRAME_SIZE`, which tonic
/// keeps): re-encoded blocks are split into frames of at most this, and a larger frame from the
/// client is a protocol error h2 reports.
pub(crate) const MAX_FRAME: usize = 16_384;
/// The largest header block followed (a gRPC request's is a few hundred bytes).
pub(crate) const MAX_BLOCK: usize = 64 * 1024;
/// The dynamic table size the server allows (`SETTINGS_HEADER_TABLE_SIZE`'s default, which
/// tonic keeps): a client's table size update above it is a decoding error.
const TABLE_SIZE: usize = 4096;
/// What an unusable authority becomes.
const LOCALHOST: &[u8] = b"localhost";

/// A header block being collected: its HEADERS frame's stream and flags, its fragments so far,
/// and the frames as they came (passed on as they are if the block cannot be followed).
struct Block {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
    raw: Vec<u8>,
}

/// The client-to-server byte stream's rewriter, frame by frame (what [`AuthorityFix`] reads
/// through; kept apart from the I/O so that tests can feed it bytes in any chunks).
pub(crate) struct Rewriter {
    preface: usize,
    pending: Vec<u8>,
    decoder: Decoder<'static>,
    block: Option<Block>,
    /// Past something that could not be followed: everything passes as it comes.
    passthrough: bool,
    /// How many authorities were replaced.
    pub(crate) rewritten: u64,
}

impl Default for Rewriter {
    fn default() -> Self {
        let mut decoder = Decoder::new();
        decoder.set_max_allowed_table_size(TABLE_SIZE);
        Rewriter { preface: PREFACE_LEN, pending: Vec::new(), decoder, block: None, passthrough: false, rewritten: 0 }
    }
}

impl Rewriter {
    /// Takes the next bytes from the client, appends what the server is to read to `out`.
    pub(crate) fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) {
        if self.passthrough {
            out.extend_from_slice(input);
            return;
        }
        self.pending.extend_from_slice(input);
        let mut at = 0;
        if self.preface > 0 {
            let n = self.preface.min(self.pending.len());
            out.extend_from_slice(&self.pending[..n]);
            self.preface -= n;
            at = n;
        }
        while self.pending.len() - at >= FRAME_HEADER {
            let head = &self.pending[at..at + FRAME_HEADER];
            let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
            if len > MAX_FRAME {
                self.give_up(at, out);
                return;
            }
            if self.pending.len() - at < FRAME_HEADER + len {
                break;
            }
            let frame = self.pending[at..at + FRAME_HEADER + len].to_vec();
            at += FRAME_HEADER + len;
            if self.frame(&frame, out).is_err() {
                // This frame (and the block it belongs to) as it came, then the rest.
                let block = self.block.take().map(|b| b.raw).unwrap_or_default();
                out.extend_from_slice(&block);
                if !block.ends_with(&frame) {
                    out.extend_from_slice(&frame);
                }
                self.give_up(at, out);
                return;
            }
        }
        self.pending.drain(..at);
    }

    /// The client closed its side: whatever is left passes as it came.
    pub(crate) fn finish(&mut self, out: &mut Vec<u8>) {
        if let Some(b) = self.block.take() {
            out.extend_from_slice(&b.raw);
        }
        out.append(&mut self.pending);
    }

    /// From `pending[at..]` on, nothing is followed any more.
    fn give_up(&mut self, at: usize, out: &mut Vec<u8>) {
        if let Some(b) = self.block.take() {
            out.extend_from_slice(&b.raw);
        }
        out.extend_from_slice(&self.pending[at..]);
        self.pending.clear();
        self.passthrough = true;
    }

    /// One whole frame (header and payload).
    fn frame(&mut self, frame: &[u8], out: &mut Vec<u8>) -> Result<(), ()> {
        let (kind, flags) = (frame[3], frame[4]);
        let stream = u32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]) & 0x7fff_ffff;
        let payload = &frame[FRAME_HEADER..];
        if let Some(b) = &mut self.block {
            // Only the block's CONTINUATION frames may come until it ends.
            if kind != CONTINUATION || stream != b.stream {
                b.raw.extend_from_slice(frame);
                return Err(());
            }
            b.fragment.extend_from_slice(payload);
            b.raw.extend_from_slice(frame);
            if b.fragment.len() > MAX_BLOCK {
                return Err(());
            }
            if flags & END_HEADERS != 0 {
                let b = self.block.take().expect("a block");
                return self.emit(b, out);
            }
            return Ok(());
        }
        if kind != HEADERS {
            out.extend_from_slice(frame);
            return Ok(());
        }
        let mut start = 0;
        let mut pad = 0;
        if flags & PADDED != 0 {
            pad = usize::from(*payload.first().ok_or(())?);
            start = 1;
        }
        let mut priority = None;
        if flags & PRIORITY != 0 {
            let p: [u8; 5] = payload.get(start..start + 5).ok_or(())?.try_into().map_err(|_| ())?;
            priority = Some(p);
            start += 5;
        }
        let end = payload.len().checked_sub(pad).filter(|e| *e >= start).ok_or(())?;
        let b = Block {
            stream,
            end_stream: flags & END_STREAM != 0,
            priority,
            fragment: payload[start..end].to_vec(),
            raw: frame.to_vec(),
        };
        if flags & END_HEADERS != 0 {
            return self.emit(b, out);
        }
        self.block = Some(b);
        Ok(())
    }

    /// A whole header block: decoded, its authority fixed, re-encoded into HEADERS (and
    /// CONTINUATION) frames for `out`.
    fn emit(&mut self, b: Block, out: &mut Vec<u8>) -> Result<(), ()> {
        let mut fields: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let decoded = self.decoder.decode_with_cb(&b.fragment, |n, v| fields.push((n.into_owned(), v.into_owned())));
        if decoded.is_err() {
            self.block = Some(b);
            return Err(());
        }
        for (name, value) in &mut fields {
            if name.as_slice() == b":authority" && !is_authority(value) {
                tracing::debug!(
                    authority = %String::from_utf8_lossy(value),
                    "API: a request's :authority is no authority (a gRPC client on the Unix socket): read as localhost"
                );
                *value = LOCALHOST.to_vec();
                self.rewritten += 1;
            }
        }
        let block = encode(&fields);
        let prefix = b.priority.map(|p| p.to_vec()).unwrap_or_default();
        let first = (MAX_FRAME - prefix.len()).min(block.len());
        let mut flags = if b.end_stream { END_STREAM } else { 0 };
        if b.priority.is_some() {
            flags |= PRIORITY;
        }
        let mut rest = &block[first..];
        if rest.is_empty() {
            flags |= END_HEADERS;
        }
        write_frame(out, HEADERS, flags, b.stream, &[&prefix, &block[..first]]);
        while !rest.is_empty() {
            let n = rest.len().min(MAX_FRAME);
            let flags = if n == rest.len() { END_HEADERS } else { 0 };
            write_frame(out, CONTINUATION, flags, b.stream, &[&rest[..n]]);
            rest = &rest[n..];
        }
        Ok(())
    }
}

/// Whether h2 takes `value` as an `:authority` (it parses it as `http`'s `Authority`).
fn is_authority(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

/// A header block of literal fields without indexing and with literal names (HPACK §6.2.2): no
/// compression state on either side.
fn encode(fields: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in fields {
        out.push(0x00);
        for s in [name, value] {
            // A string literal without Huffman coding: its length with a 7-bit prefix (H = 0).
            loona_hpack::encoder::encode_integer_into(s.len(), 7, 0, &mut out).expect("writing to a Vec");
            out.extend_from_slice(s);
        }
    }
    out
}

fn write_frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, parts: &[&[u8]]) {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    for p in parts {
        out.extend_from_slice(p);
    }
}

/// A Unix-socket connection whose client side is read through a [`Rewriter`]; writes pass
/// through.
pub(crate) struct AuthorityFix<S> {
    inner: S,
    rewriter: Rewriter,
    out: Vec<u8>,
    at: usize,
    eof: bool,
    buf: Box<[u8]>,
}

impl<S> AuthorityFix<S> {
    pub(crate) fn new(inner: S) -> Self {
        AuthorityFix {
            inner,
            rewriter: Rewriter::default(),
            out: Vec::new(),
            at: 0,
            eof: false,
            buf: vec![0; MAX_FRAME].into_boxed_slice(),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, dst: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.at < this.out.len() {
                let n = dst.remaining().min(this.out.len() - this.at);
                dst.put_slice(&this.out[this.at..this.at + n]);
                this.at += n;
                if this.at == this.out.len() {
                    this.out.clear();
                    this.at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            let mut rb = ReadBuf::new(&mut this.buf);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut rb))?;
            if rb.filled().is_empty() {
                this.eof = true;
                this.rewriter.finish(&mut this.out);
            } else {
                this.rewriter.feed(rb.filled(), &mut this.out);
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<S: Connected> Connected for AuthorityFix<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests;
