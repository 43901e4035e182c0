//! Draining the `EVENTS` ring buffer from tokio. The kernel batches wake-ups (one per
//! `wakeup_every` records per CPU), so the drain also runs on a short timer.
use std::{os::fd::AsRawFd, time::Duration};

use aya::{
    Ebpf,
    maps::{MapData, RingBuf},
};
use tokio::io::unix::AsyncFd;
use tracer_common::map_names;

/// A wrapper so `AsyncFd` can own the ring buffer.
struct RingFd(RingBuf<MapData>);
impl AsRawFd for RingFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.as_raw_fd()
    }
}

/// The ring-buffer source.
pub struct RingSource {
    ring: AsyncFd<RingFd>,
    /// Records taken out of the ring buffer so far.
    pub received: u64,
}

/// Errors opening the source.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("eBPF map EVENTS missing or already taken")]
    MissingRing,
    #[error("EVENTS is not a ring buffer: {0}")]
    Map(#[from] aya::maps::MapError),
    #[error("registering the ring buffer with tokio: {0}")]
    Io(#[from] std::io::Error),
    #[error("the ring buffer source must be created inside a tokio runtime (with I/O enabled)")]
    NoRuntime,
}

impl RingSource {
    /// Take the ring buffer out of the loaded object.
    pub fn new(ebpf: &mut Ebpf) -> Result<Self, SourceError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(SourceError::NoRuntime);
        }
        let map = ebpf.take_map(map_names::EVENTS).ok_or(SourceError::MissingRing)?;
        let ring = RingBuf::try_from(map)?;
        // SAFETY: the fd is owned by `ring`, which the AsyncFd owns and drops after deregistering.
        let ring = unsafe { AsyncFd::register(RingFd(ring)) }.map_err(|e| SourceError::Io(e.into()))?;
        Ok(Self { ring, received: 0 })
    }

    /// Wait until the kernel signals data or `timeout` passes (batched wake-ups leave records
    /// waiting without a signal; the timer bounds their latency).
    pub async fn wait(&mut self, timeout: Duration) {
        if let Ok(Ok(mut guard)) = tokio::time::timeout(timeout, self.ring.readable_mut()).await {
            guard.clear_ready();
        }
    }

    /// Hand every waiting record to `f`, at most `max` of them; returns how many.
    pub fn drain(&mut self, max: usize, mut f: impl FnMut(&[u8])) -> usize {
        let mut n = 0;
        let ring = &mut self.ring.get_mut().0;
        while n < max {
            let Some(item) = ring.next() else { break };
            f(&item);
            n += 1;
        }
        self.received += n as u64;
        n
    }
}
