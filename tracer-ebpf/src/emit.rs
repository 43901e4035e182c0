//! The only module that writes to the ring buffers or touches the counters: every record that is
//! not delivered is counted, so `seen == emitted + Σ dropped` holds per probe.
use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    maps::ring_buf::RingBufEntry,
};
use tracer_common::{EventHeader, Record, counter};

use crate::maps::{BULK_EVENTS, CONFIG, COUNTERS, EVENTS, LOST_RECORDS, WAKEUP_SEQ};

/// Add one to `COUNTERS[probe][slot]` on this CPU.
#[inline(always)]
pub fn count(probe: u32, slot: u32) {
    if let Some(p) = COUNTERS.get_ptr_mut(probe * counter::SLOTS + slot) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU while we run.
        unsafe { *p += 1 };
    }
}

/// Count `seen` and one drop reason for a probe (an event that never reached the ring buffer).
#[inline(always)]
pub fn drop_event(probe: u32, reason: u32) {
    count(probe, counter::SEEN);
    count(probe, reason);
    if reason != counter::DROP_NOT_A_DEVICE {
        mark_lost(probe);
    }
}

/// Remember that the current process lost a record of a probe its ledgers are built from
/// (`probe::LEDGER`; the first loss's time is kept).
#[inline(always)]
fn mark_lost(probe: u32) {
    if !tracer_common::probe::is_ledger(probe) {
        return;
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: bpf_ktime_get_ns takes no arguments and only reads the monotonic clock.
    let now = unsafe { bpf_ktime_get_ns() };
    // BPF_NOEXIST: the first loss's time stays; a full map is covered by the global counters.
    let _ = LOST_RECORDS.insert(&tgid, &now, aya_ebpf::bindings::BPF_NOEXIST as u64);
}

/// Which ring buffer a record goes through.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Ring {
    /// `EVENTS`: records a ledger is built from. A loss marks the process's ledgers.
    Ledger,
    /// `BULK_EVENTS`: high-rate records that only count. A flood of them fills this ring, never
    /// the ledger's; a loss is counted (`bulk_ringbuf_full`) and marks no ledger.
    Bulk,
}

/// Reserve a record of type `R` on the ledger ring and fill its header (see [`reserve_in`]).
#[inline(always)]
pub fn reserve<R: Record + 'static>(probe: u32, flags: u16) -> Option<RingBufEntry<R>> {
    reserve_in::<R>(Ring::Ledger, probe, flags)
}

/// Reserve a record of type `R` on `ring` and fill its header. Counts `seen`, and
/// `ringbuf_full` (ledger ring) or `bulk_ringbuf_full` when the ring buffer is full. The caller
/// fills the body and calls [`submit`].
#[inline(always)]
pub fn reserve_in<R: Record + 'static>(ring: Ring, probe: u32, flags: u16) -> Option<RingBufEntry<R>> {
    // SAFETY: helpers without arguments: the monotonic clock and the current task's cgroup.
    let (now, cgroup_id) = unsafe { (bpf_ktime_get_ns(), bpf_get_current_cgroup_id()) };
    reserve_at::<R>(ring, probe, flags, bpf_get_current_pid_tgid(), now, cgroup_id)
}

/// [`reserve_in`] with the caller's `pid_tgid`, clock reading and cgroup id (a hot path that has
/// them already saves the helper calls).
#[inline(always)]
pub fn reserve_at<R: Record + 'static>(
    ring: Ring,
    probe: u32,
    flags: u16,
    pid_tgid: u64,
    ktime_ns: u64,
    cgroup_id: u64,
) -> Option<RingBufEntry<R>> {
    count(probe, counter::SEEN);
    let reserved = match ring {
        Ring::Ledger => EVENTS.reserve::<R>(0),
        Ring::Bulk => BULK_EVENTS.reserve::<R>(0),
    };
    let Some(mut entry) = reserved else {
        if ring == Ring::Ledger {
            count(probe, counter::DROP_RINGBUF_FULL);
            mark_lost(probe);
        } else {
            count(probe, counter::DROP_BULK_RINGBUF_FULL);
        }
        return None;
    };
    let hdr = EventHeader {
        kind: R::KIND,
        flags,
        size: size_of::<R>() as u32,
        ktime_ns,
        tgid: (pid_tgid >> 32) as u32,
        pid: pid_tgid as u32,
        cgroup_id,
    };
    // SAFETY: every record starts with an EventHeader (repr(C)); the entry is R-sized.
    unsafe { core::ptr::write(entry.as_mut_ptr() as *mut EventHeader, hdr) };
    Some(entry)
}

/// Submit a reserved record. User space is woken only when a ring has filled up (checked every
/// `wakeup_every` records per CPU: at least `wakeup_bytes` unread in either ring); otherwise it
/// drains on its own timer (`drain_interval_ms`). A wake-up is an irq_work and a cross-CPU
/// wake of the consumer, which cost ~180 ns per record at one wake-up per 64 records
/// (docs/benchmarks.md, issue 15); the fill check is two helper calls per `wakeup_every` records.
#[inline(always)]
pub fn submit<R: Record>(probe: u32, entry: RingBufEntry<R>) {
    let (every, min_bytes) = match CONFIG.get(0) {
        Some(c) => (c.wakeup_every as u64, c.wakeup_bytes as u64),
        None => (1, 0),
    };
    let mut flags = BPF_RB_NO_WAKEUP as u64;
    if every <= 1 {
        flags = BPF_RB_FORCE_WAKEUP as u64;
    } else if let Some(seq) = WAKEUP_SEQ.get_ptr_mut(0) {
        // SAFETY: per-CPU slot.
        let due = unsafe {
            *seq += 1;
            *seq % every == 0
        };
        if due
            && (min_bytes == 0
                || EVENTS.query(BPF_RB_AVAIL_DATA as u64) >= min_bytes
                || BULK_EVENTS.query(BPF_RB_AVAIL_DATA as u64) >= min_bytes)
        {
            flags = BPF_RB_FORCE_WAKEUP as u64;
        }
    }
    entry.submit(flags);
    count(probe, counter::EMITTED);
}
