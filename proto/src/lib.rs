//! gpu-tracer's schemas, `gputracer.v1`, generated from `proto/gputracer/v1/*.proto` (field meanings
//! are documented there): the event stream (`events.proto`), the snapshot (`snapshot.proto`) and,
//! with the `api` feature, the agent's gRPC service (`api.proto`: `v1::gpu_tracer_server`,
//! `v1::gpu_tracer_client`).
//!
//! A stream is a sequence of [`v1::Event`]s, each written with prost's
//! [`Message::encode_length_delimited`] (a varint length,
//! then the message). [`read_stream`] reads one back.

/// Generated types of package `gputracer.v1`.
pub mod v1 {
    // prost writes fully qualified paths (`::prost::alloc::vec::Vec`, `super::…`) so its output compiles
    // wherever it is included; that is not ours to trim.
    #![allow(missing_docs, clippy::all, unused_qualifications)]
    include!(concat!(env!("OUT_DIR"), "/gputracer.v1.rs"));
    // `gpu_tracer_server`, generated apart so that `Subscribe` sends pre-encoded responses.
    #[cfg(feature = "api")]
    include!(concat!(env!("OUT_DIR"), "/server/gputracer.v1.rs"));
}

/// The subset of Perfetto's trace format (`perfetto.protos`, `proto/perfetto/trace_subset.proto`)
/// that `gpu-tracer profile` writes: open the file in ui.perfetto.dev.
pub mod perfetto {
    #![allow(missing_docs, clippy::all, unused_qualifications)]
    include!(concat!(env!("OUT_DIR"), "/perfetto.protos.rs"));
}

/// A `gputracer.v1.SubscribeResponse` already encoded: what the agent's `Subscribe` stream sends.
/// The agent encodes each event once and hands the same bytes (a shared [`prost::bytes::Bytes`]) to
/// every subscriber; on the wire it is an ordinary `SubscribeResponse`, which clients decode as
/// [`v1::SubscribeResponse`]. Only ever encoded: decoding one skips every field.
#[cfg(feature = "api")]
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EncodedSubscribeResponse(pub prost::bytes::Bytes);

#[cfg(feature = "api")]
impl EncodedSubscribeResponse {
    /// Encodes `response`.
    pub fn new(response: &v1::SubscribeResponse) -> Self {
        EncodedSubscribeResponse(response.encode_to_vec().into())
    }

    /// `event` as the `SubscribeResponse { event = 1 }` subscribers receive, encoded once into a
    /// buffer of exactly its size. Here, next to the generated code, prost's generic encoders are
    /// instantiated in this small crate, not in the caller's (bench §8: the hub's encoding was
    /// ~10 % slower instantiated in the agent's crate).
    ///
    /// The event's length is computed once: `prost::encoding::message::encode` would compute it
    /// again for the length prefix after the buffer was sized with it (bench §8: a whole pass of
    /// the event, ~10 % of an encoding). So the field's key and length are written here and the
    /// body by `Message::encode_raw` — the method prost's own `encode` calls after writing the
    /// same two (doc-hidden in prost, stable as a trait method; `of_event_is_prosts_encoding`
    /// checks the bytes against `SubscribeResponse::encode_to_vec`).
    #[inline(never)]
    pub fn of_event(event: &v1::Event) -> Self {
        use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint};
        let len = event.encoded_len();
        let mut buf = Vec::with_capacity(1 + encoded_len_varint(len as u64) + len);
        encode_key(1, WireType::LengthDelimited, &mut buf);
        encode_varint(len as u64, &mut buf);
        event.encode_raw(&mut buf);
        debug_assert_eq!(buf.len(), buf.capacity());
        EncodedSubscribeResponse(buf.into())
    }

    /// The event it holds (`None` when it holds none, or the bytes do not decode).
    pub fn event(&self) -> Option<v1::Event> {
        match v1::SubscribeResponse::decode(&self.0[..]) {
            Ok(v1::SubscribeResponse { response: Some(v1::subscribe_response::Response::Event(ev)) }) => Some(ev),
            _ => None,
        }
    }

    /// The event it holds in the `events` stream's framing (a varint length, then the
    /// `gputracer.v1.Event`), as a view of the same bytes: `SubscribeResponse { event = 1 }` is the
    /// tag byte `0x0a` followed by exactly that. `None` when it holds no event (a `LostEvents`) or
    /// the length does not match what follows.
    pub fn event_length_delimited(&self) -> Option<prost::bytes::Bytes> {
        if self.0.first() != Some(&0x0a) {
            return None;
        }
        let mut rest = &self.0[1..];
        let len = prost::encoding::decode_varint(&mut rest).ok()?;
        (len == rest.len() as u64).then(|| self.0.slice(1..))
    }
}

#[cfg(feature = "api")]
impl Message for EncodedSubscribeResponse {
    fn encode_raw(&self, buf: &mut impl prost::bytes::BufMut) {
        buf.put_slice(&self.0);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: prost::encoding::WireType,
        buf: &mut impl prost::bytes::Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        self.0.len()
    }

    fn clear(&mut self) {
        self.0 = prost::bytes::Bytes::new();
    }
}

/// The kubelet pod-resources API (`k8s.io/kubelet/pkg/apis/podresources/v1`, proto package `v1`),
/// generated from `proto/podresources/v1/api.proto`: its messages, and with the `kubelet` feature
/// its tonic client (`podresources::v1::pod_resources_lister_client`) and server
/// (`podresources::v1::pod_resources_lister_server`).
pub mod podresources {
    /// Generated types of package `v1`.
    pub mod v1 {
        // prost and tonic write fully qualified paths (`::prost::alloc::string::String`, `super::…`) so
        // their output compiles wherever it is included; that is not ours to trim.
        #![allow(missing_docs, clippy::all, unused_qualifications)]
        include!(concat!(env!("OUT_DIR"), "/v1.rs"));
        #[cfg(feature = "kubelet")]
        include!(concat!(env!("OUT_DIR"), "/kubelet/v1.rs"));
    }
}

pub use prost;
#[cfg(any(feature = "kubelet", feature = "api"))]
pub use tonic;

use prost::Message;

/// Decodes a length-delimited stream of [`v1::Event`]s, in order. Yields an error (and then stops)
/// at the first event that cannot be decoded, including a truncated last event.
pub fn read_stream(mut bytes: &[u8]) -> impl Iterator<Item = Result<v1::Event, prost::DecodeError>> + '_ {
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed || bytes.is_empty() {
            return None;
        }
        let event = v1::Event::decode_length_delimited(&mut bytes);
        failed = event.is_err();
        Some(event)
    })
}

#[cfg(test)]
mod tests;
