//! The kernel's per-probe counters (`COUNTERS`) as plain data: seen, emitted, aggregated and
//! dropped by reason, per probe (the agent's `source::counters` reads them each interval).
use serde::{Serialize, Serializer, ser::SerializeMap};
use tracer_common::counter;

/// How many drop reasons there are: the slots `counter::DROP_FIRST..=counter::DROP_LAST`.
pub(crate) const N_DROP_REASONS: usize = (counter::DROP_LAST - counter::DROP_FIRST + 1) as usize;

/// The name of each drop reason (the `reason` label), from `counter::NAMES`.
pub(crate) fn drop_reasons() -> &'static [&'static str] {
    &counter::NAMES[counter::DROP_FIRST as usize..=counter::DROP_LAST as usize]
}

/// Counters for one probe, summed over CPUs.
///
/// The drops are a table indexed by reason, so that a new reason in `tracer_common::counter`
/// (a slot, its name in `NAMES`, `DROP_LAST`) reaches the reading, the totals, `/metrics` and the
/// JSON without an edit here. Serialised as `seen`, `emitted`, one `dropped_<reason>` per reason,
/// `aggregated`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProbeCounters {
    pub seen: u64,
    pub emitted: u64,
    /// Calls lost in the kernel, by reason: index `slot - counter::DROP_FIRST` (see
    /// [`ProbeCounters::drops`], [`ProbeCounters::dropped_at`]).
    pub dropped_by_reason: [u64; N_DROP_REASONS],
    /// Calls counted in an in-kernel aggregate instead of a ring-buffer record.
    pub aggregated: u64,
}

impl ProbeCounters {
    /// Calls lost in the kernel, all reasons.
    pub fn dropped(&self) -> u64 {
        self.dropped_by_reason.iter().sum()
    }

    /// `(reason, calls lost)` for every drop reason, in slot order (also the reasons at 0).
    pub fn drops(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        drop_reasons().iter().copied().zip(self.dropped_by_reason)
    }

    /// Calls lost for the reason in `counter` slot `slot` (e.g. `counter::DROP_RINGBUF_FULL`).
    /// Panics when `slot` is not a drop reason.
    pub fn dropped_at(&self, slot: u32) -> u64 {
        self.dropped_by_reason[drop_index(slot)]
    }

    /// Set the calls lost for the reason in `counter` slot `slot`. Panics when `slot` is not a
    /// drop reason.
    pub fn set_dropped(&mut self, slot: u32, calls: u64) {
        self.dropped_by_reason[drop_index(slot)] = calls;
    }
}

fn drop_index(slot: u32) -> usize {
    assert!((counter::DROP_FIRST..=counter::DROP_LAST).contains(&slot), "counter slot {slot} is not a drop reason");
    (slot - counter::DROP_FIRST) as usize
}

/// Field by field (drops reason by reason): the counters of several probes or reads.
impl std::ops::AddAssign<&ProbeCounters> for ProbeCounters {
    fn add_assign(&mut self, o: &ProbeCounters) {
        let ProbeCounters { seen, emitted, dropped_by_reason, aggregated } = *o;
        self.seen += seen;
        self.emitted += emitted;
        for (t, d) in self.dropped_by_reason.iter_mut().zip(dropped_by_reason) {
            *t += d;
        }
        self.aggregated += aggregated;
    }
}

impl Serialize for ProbeCounters {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut m = serializer.serialize_map(Some(3 + N_DROP_REASONS))?;
        m.serialize_entry("seen", &self.seen)?;
        m.serialize_entry("emitted", &self.emitted)?;
        for (reason, calls) in self.drops() {
            m.serialize_entry(&format!("dropped_{reason}"), &calls)?;
        }
        m.serialize_entry("aggregated", &self.aggregated)?;
        m.end()
    }
}

/// All probes' counters, indexed by `tracer_common::probe` id.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KernelCounters {
    pub probes: Vec<(String, ProbeCounters)>,
}

impl KernelCounters {
    pub fn total(&self) -> ProbeCounters {
        let mut t = ProbeCounters::default();
        for (_, c) in &self.probes {
            t += c;
        }
        t
    }
    pub fn get(&self, name: &str) -> ProbeCounters {
        self.probes.iter().find(|(n, _)| n == name).map(|(_, c)| *c).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests;
