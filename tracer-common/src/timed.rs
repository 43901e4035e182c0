use crate::cuda_entry::*;

/// What a timed call does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Blocks the host thread until a stream, the context or an event is done.
    Synchronize,
    /// Polls an event (returns at once: CUDA_SUCCESS done, CUDA_ERROR_NOT_READY not yet).
    Query,
    /// Makes a stream wait for an event (GPU-side; the host does not block).
    Wait,
    /// Records an event on a stream.
    Record,
    /// A memory copy.
    Copy,
    /// A memset.
    Set,
}

/// The class of timed entry point `id`; `None` for any other id.
pub const fn class(id: u32) -> Option<Class> {
    Some(match id {
        STREAM_SYNCHRONIZE | STREAM_SYNCHRONIZE_PTSZ | CTX_SYNCHRONIZE | EVENT_SYNCHRONIZE => Class::Synchronize,
        EVENT_QUERY => Class::Query,
        STREAM_WAIT_EVENT | STREAM_WAIT_EVENT_PTSZ => Class::Wait,
        EVENT_RECORD | EVENT_RECORD_PTSZ | EVENT_RECORD_WITH_FLAGS | EVENT_RECORD_WITH_FLAGS_PTSZ => Class::Record,
        MEMCPY..=MEMCPY_DTOD_ASYNC_PTSZ => Class::Copy,
        MEMSET_D8..=MEMSET_D32_ASYNC_PTSZ => Class::Set,
        _ => return None,
    })
}

/// Bytes a copy or memset moves or writes (0 for the others).
pub const fn bytes(id: u32, args: &[u64; 4]) -> u64 {
    match id {
        MEMCPY..=MEMCPY_DTOD_ASYNC_PTSZ | MEMSET_D8 | MEMSET_D8_PTDS | MEMSET_D8_ASYNC | MEMSET_D8_ASYNC_PTSZ => {
            args[2]
        }
        // Clamped so that the product fits (no 128-bit multiply in BPF).
        MEMSET_D32 | MEMSET_D32_PTDS | MEMSET_D32_ASYNC | MEMSET_D32_ASYNC_PTSZ => {
            (if args[2] > u32::MAX as u64 { u32::MAX as u64 } else { args[2] }) * 4
        }
        _ => 0,
    }
}

/// The stream a call is on: its argument, or 0 (the legacy default stream) for the synchronous
/// copies and memsets, 2 (`CU_STREAM_PER_THREAD`) for their `_ptds` forms; `None` for calls that
/// name no stream (context and event synchronisation, event queries).
pub const fn stream(id: u32, args: &[u64; 4]) -> Option<u64> {
    match id {
        STREAM_SYNCHRONIZE | STREAM_SYNCHRONIZE_PTSZ | STREAM_WAIT_EVENT | STREAM_WAIT_EVENT_PTSZ => Some(args[0]),
        EVENT_RECORD | EVENT_RECORD_PTSZ | EVENT_RECORD_WITH_FLAGS | EVENT_RECORD_WITH_FLAGS_PTSZ => Some(args[1]),
        MEMCPY_ASYNC
        | MEMCPY_ASYNC_PTSZ
        | MEMCPY_HTOD_ASYNC
        | MEMCPY_HTOD_ASYNC_PTSZ
        | MEMCPY_DTOH_ASYNC
        | MEMCPY_DTOH_ASYNC_PTSZ
        | MEMCPY_DTOD_ASYNC
        | MEMCPY_DTOD_ASYNC_PTSZ
        | MEMSET_D8_ASYNC
        | MEMSET_D8_ASYNC_PTSZ
        | MEMSET_D32_ASYNC
        | MEMSET_D32_ASYNC_PTSZ => Some(args[3]),
        MEMCPY | MEMCPY_HTOD | MEMCPY_DTOH | MEMCPY_DTOD | MEMSET_D8 | MEMSET_D32 => Some(0),
        MEMCPY_PTDS | MEMCPY_HTOD_PTDS | MEMCPY_DTOH_PTDS | MEMCPY_DTOD_PTDS | MEMSET_D8_PTDS | MEMSET_D32_PTDS => {
            Some(2)
        }
        _ => None,
    }
}

/// The event a call names, if any.
pub const fn event(id: u32, args: &[u64; 4]) -> Option<u64> {
    match id {
        EVENT_SYNCHRONIZE
        | EVENT_QUERY
        | EVENT_RECORD
        | EVENT_RECORD_PTSZ
        | EVENT_RECORD_WITH_FLAGS
        | EVENT_RECORD_WITH_FLAGS_PTSZ => Some(args[0]),
        STREAM_WAIT_EVENT | STREAM_WAIT_EVENT_PTSZ => Some(args[1]),
        _ => None,
    }
}

/// Whether a copy or memset returns before the work is done (the `Async` ones).
pub const fn is_async(id: u32) -> bool {
    matches!(
        id,
        MEMCPY_ASYNC
            | MEMCPY_ASYNC_PTSZ
            | MEMCPY_HTOD_ASYNC
            | MEMCPY_HTOD_ASYNC_PTSZ
            | MEMCPY_DTOH_ASYNC
            | MEMCPY_DTOH_ASYNC_PTSZ
            | MEMCPY_DTOD_ASYNC
            | MEMCPY_DTOD_ASYNC_PTSZ
            | MEMSET_D8_ASYNC
            | MEMSET_D8_ASYNC_PTSZ
            | MEMSET_D32_ASYNC
            | MEMSET_D32_ASYNC_PTSZ
    )
}

/// A copy's direction, from the entry point (`cuMemcpy` and `cuMemcpyAsync` infer it from
/// unified addresses: "any").
pub const fn direction(id: u32) -> &'static str {
    match id {
        MEMCPY_HTOD | MEMCPY_HTOD_PTDS | MEMCPY_HTOD_ASYNC | MEMCPY_HTOD_ASYNC_PTSZ => "htod",
        MEMCPY_DTOH | MEMCPY_DTOH_PTDS | MEMCPY_DTOH_ASYNC | MEMCPY_DTOH_ASYNC_PTSZ => "dtoh",
        MEMCPY_DTOD | MEMCPY_DTOD_PTDS | MEMCPY_DTOD_ASYNC | MEMCPY_DTOD_ASYNC_PTSZ => "dtod",
        _ => "any",
    }
}
