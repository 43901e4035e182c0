//! Draining the two ring buffers from tokio: the ledger ring (`EVENTS`: fds, lifecycle,
//! allocations, frees) and the bulk ring (`BULK_EVENTS`: count-only records). The kernel batches
//! wake-ups (one per `wakeup_every` records per CPU), so the drain also runs on a short timer.
//!
//! The ledger ring is drained first. The two rings are not ordered with respect to each other:
//! a count-only record of a process can be read after that process's exit record, which the
//! state handles (`TracerState` charges it to the cgroup without bringing the process back).
use std::{os::fd::AsRawFd, time::Duration};

use aya::{
    Ebpf,
    maps::{MapData, RingBuf},
};
use tokio::io::unix::AsyncFd;
use tracer_common::map_names;

/// A wrapper so `AsyncFd` can own a ring buffer.
struct RingFd(RingBuf<MapData>);
impl AsRawFd for RingFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.as_raw_fd()
    }
}

/// The ring-buffer source: both rings.
pub(crate) struct RingSource {
    ledger: AsyncFd<RingFd>,
    bulk: AsyncFd<RingFd>,
    /// Records taken out of the ledger ring so far.
    pub received_ledger: u64,
    /// Records taken out of the bulk ring so far.
    pub received_bulk: u64,
}

/// Errors opening the source.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("eBPF map {0} missing or already taken")]
    MissingRing(&'static str),
    #[error("a ring buffer map is not a ring buffer: {0}")]
    Map(#[from] aya::maps::MapError),
    #[error("registering the ring buffer with tokio: {0}")]
    Io(#[from] std::io::Error),
    #[error("the ring buffer source must be created inside a tokio runtime (with I/O enabled)")]
    NoRuntime,
}

fn take(ebpf: &mut Ebpf, name: &'static str) -> Result<AsyncFd<RingFd>, SourceError> {
    let map = ebpf.take_map(name).ok_or(SourceError::MissingRing(name))?;
    let ring = RingBuf::try_from(map)?;
    // SAFETY: the fd is owned by `ring`, which the AsyncFd owns and drops after deregistering.
    unsafe { AsyncFd::register(RingFd(ring)) }.map_err(|e| SourceError::Io(e.into()))
}

impl RingSource {
    /// Take both ring buffers out of the loaded object.
    pub fn new(ebpf: &mut Ebpf) -> Result<Self, SourceError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(SourceError::NoRuntime);
        }
        let ledger = take(ebpf, map_names::EVENTS)?;
        let bulk = take(ebpf, map_names::BULK_EVENTS)?;
        Ok(Self { ledger, bulk, received_ledger: 0, received_bulk: 0 })
    }

    /// Wait until the kernel signals data on either ring or `timeout` passes (batched wake-ups
    /// leave records waiting without a signal; the timer bounds their latency).
    pub async fn wait(&mut self, timeout: Duration) {
        let (ledger, bulk) = (&mut self.ledger, &mut self.bulk);
        let _ = tokio::time::timeout(timeout, async {
            tokio::select! {
                r = ledger.readable_mut() => if let Ok(mut g) = r { g.clear_ready() },
                r = bulk.readable_mut() => if let Ok(mut g) = r { g.clear_ready() },
            }
        })
        .await;
    }

    /// Hand waiting records to `f`, the ledger ring's first, at most `max` of them; returns how
    /// many.
    pub fn drain(&mut self, max: usize, mut f: impl FnMut(&[u8])) -> usize {
        let ledger = drain_one(&mut self.ledger.get_mut().0, max, &mut f);
        let bulk = drain_one(&mut self.bulk.get_mut().0, max - ledger, &mut f);
        self.received_ledger += ledger as u64;
        self.received_bulk += bulk as u64;
        ledger + bulk
    }
}

fn drain_one(ring: &mut RingBuf<MapData>, max: usize, f: &mut impl FnMut(&[u8])) -> usize {
    let mut n = 0;
    while n < max {
        let Some(item) = ring.next() else { break };
        f(&item);
        n += 1;
    }
    n
}
