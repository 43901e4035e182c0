//! The event hub: every event the agent emits, fanned out to the API's subscribers without ever
//! making the agent wait.
//!
//! The agent loop [`publish`](EventHub::publish)es each event once: it is numbered, encoded once
//! (the same bytes go to every subscriber) and appended to one bounded ring that is both the
//! replay history and every subscriber's buffer. Publishing takes a short lock and never waits for
//! a subscriber; subscribers are woken once per [`flush`](EventHub::flush) (the agent flushes after
//! each step), not once per event. Each subscriber keeps a cursor (the next event number it wants)
//! and copies events out of the ring in batches; a subscriber whose cursor fell out of the ring has
//! lost exactly `oldest held − cursor` events, which it is told ([`Received::Lost`]) before it goes
//! on with the oldest event still held. Memory is bounded by the ring's size whatever the
//! subscribers do.
//!
//! What the ring holds per event ([`Published`], 72 bytes in place) is its number, its encoding
//! and a 32-byte [`EventKey`] (kind, wall time, cgroup id, GPU minor, a namespace hash), not the
//! decoded message: that is 744 bytes in place plus a heap block per string (cgroup path, container
//! identity). For an RM allocation with a pod identity that is about 0.6 KiB held (2 heap blocks)
//! instead of 1.7 KiB (15 blocks), measured in `export::api::tests`: some 9 MiB instead of 26 MiB
//! for a full ring of 16 384 such events. Filters decide from the key where it is enough (no
//! filter, `kind`, `cgroup_id`, `violations_only`, a GPU minor, and every event of a namespace no
//! filter names); only a subscriber whose filters need the message decodes it from the bytes
//! ([`EventHub::matches`], counted in [`EventHub::decoded`]), and only for the events the key did
//! not decide.
use std::{
    collections::VecDeque,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
};

use gpu_tracer_proto::{EncodedSubscribeResponse, v1};
use tokio::sync::watch;
use tracer_core::config::api::HubSettings;

pub use tracer_core::filter::EventKey;
use tracer_core::filter::Filters;

pub use tracer_core::model::ApiStats as HubStats;

/// Events published between two automatic wake-ups of the subscribers when the caller does not
/// [`flush`](EventHub::flush) sooner.
const FLUSH_EVERY: u64 = 256;

/// One event as the hub holds it: its place in the agent's stream, what filters can check
/// without the message, and its encoding as a `SubscribeResponse`, made once and sent as is to
/// every subscriber (copies share the bytes). The message itself is not kept:
/// [`event`](Published::event) decodes it.
#[derive(Clone, Debug)]
pub struct Published {
    /// 1 for the first event published, then +1 per event: gaps are events a subscriber lost.
    pub seq: u64,
    /// The event's [`EventKey`].
    pub key: EventKey,
    /// `SubscribeResponse { event }`.
    pub encoded: EncodedSubscribeResponse,
}

impl Published {
    /// The event, decoded from its bytes; `None` if they do not hold a `SubscribeResponse` with
    /// an event (never for bytes the hub encoded).
    pub fn event(&self) -> Option<v1::Event> {
        self.encoded.event()
    }
}

/// The fan-out point between the agent loop and the API's subscribers.
#[derive(Debug)]
pub struct EventHub {
    settings: HubSettings,
    /// Kinds the history keeps even when no subscriber is connected (`None`: every kind).
    history_kinds: Option<std::collections::BTreeSet<i32>>,
    /// The newest `capacity` events, oldest first; their numbers are consecutive.
    ring: Mutex<VecDeque<Published>>,
    capacity: usize,
    /// The number of the newest event subscribers were told about.
    head: watch::Sender<u64>,
    /// `true` once the agent stops: every subscription ends.
    closed: watch::Sender<bool>,
    next_seq: AtomicU64,
    subscribers: AtomicUsize,
    subscriptions: AtomicU64,
    refused: AtomicU64,
    /// Events subscribers were told they lost (`Received::Lost`).
    lost: AtomicU64,
    /// Each connected subscriber's cursor, by subscription number: what a subscriber that is
    /// behind (one that does not read) has lost is counted before it is told ([`EventHub::stats`]).
    cursors: Mutex<Vec<(u64, Arc<AtomicU64>)>>,
    /// Events decoded because a subscriber's filters needed more than the key.
    decoded: AtomicU64,
    /// Of those, events whose bytes did not decode (skipped; never expected).
    undecodable: AtomicU64,
}

/// The hub is full: `max_subscribers` subscribers are connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the agent already serves {0} subscribers (its limit); close one, or raise api.max_subscribers")]
pub struct TooManySubscribers(pub usize);

impl EventHub {
    /// An empty hub.
    pub fn new(settings: HubSettings) -> Self {
        let capacity = settings.history.max(settings.subscriber_buffer).max(1);
        EventHub {
            settings,
            history_kinds: None,
            ring: Mutex::new(VecDeque::with_capacity(capacity.min(4096))),
            capacity,
            head: watch::Sender::new(0),
            closed: watch::Sender::new(false),
            next_seq: AtomicU64::new(1),
            subscribers: AtomicUsize::new(0),
            subscriptions: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            cursors: Mutex::new(Vec::new()),
            decoded: AtomicU64::new(0),
            undecodable: AtomicU64::new(0),
        }
    }

    /// The settings it was made with.
    pub fn settings(&self) -> HubSettings {
        self.settings
    }

    /// Keep only these `EventKind`s in the history while no subscriber is connected (`None`:
    /// every kind). High-rate kinds (RM controls, other ioctls) then cost the agent nothing when
    /// nobody listens; with a subscriber connected every event is published.
    pub(crate) fn with_history_kinds(mut self, kinds: Option<std::collections::BTreeSet<i32>>) -> Self {
        self.history_kinds = kinds;
        self
    }

    /// Does anyone take events (a history to keep, or a subscriber)? When not, the caller can
    /// skip building the message.
    pub(crate) fn wants_events(&self) -> bool {
        self.settings.history > 0 || self.subscribers.load(Ordering::Relaxed) > 0
    }

    /// Does anyone take an event of this `EventKind` (a subscriber, or a history that keeps it)?
    pub(crate) fn wants_kind(&self, kind: i32) -> bool {
        self.subscribers.load(Ordering::Relaxed) > 0
            || (self.settings.history > 0 && self.history_kinds.as_ref().is_none_or(|k| k.contains(&kind)))
    }

    /// Adds one event to the ring (the oldest out when full). Never waits for a subscriber;
    /// subscribers see it at the next [`flush`](EventHub::flush) (at the latest after
    /// [`FLUSH_EVERY`] events).
    pub fn publish(&self, event: v1::Event) {
        let key = EventKey::of(&event);
        let encoded = Self::encode(&event);
        drop(event);
        self.publish_encoded(key, encoded);
    }

    /// `event` as the `SubscribeResponse` subscribers receive, encoded once into a buffer of
    /// exactly its size (the bytes hold no spare capacity). The same bytes can go to other
    /// consumers (the OTLP exporter queues them instead of a copy of the message).
    pub fn encode(event: &v1::Event) -> EncodedSubscribeResponse {
        EncodedSubscribeResponse::of_event(event)
    }

    /// Publish an event already encoded by [`encode`](Self::encode), with its key.
    pub fn publish_encoded(&self, key: EventKey, encoded: EncodedSubscribeResponse) {
        let (seq, oldest) = {
            let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
            // Numbered under the lock, so the ring's numbers are consecutive.
            let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
            let oldest = if ring.len() == self.capacity { ring.pop_front() } else { None };
            ring.push_back(Published { seq, key, encoded });
            (seq, oldest)
        };
        // Freed outside the lock.
        drop(oldest);
        if seq.is_multiple_of(FLUSH_EVERY) {
            self.flush();
        }
    }

    /// The number of the newest event published (0 before the first).
    pub(crate) fn newest_seq(&self) -> u64 {
        self.next_seq.load(Ordering::Relaxed) - 1
    }

    /// Wakes the subscribers for everything published so far (once per agent step).
    pub fn flush(&self) {
        let newest = self.next_seq.load(Ordering::Relaxed) - 1;
        self.head.send_if_modified(|h| {
            let changed = *h != newest;
            *h = newest;
            changed
        });
    }

    /// Subscribes: the history as it is now (the newest `history` events, oldest first) and a
    /// cursor on every event after it. Refused when `max_subscribers` are connected.
    pub fn subscribe(self: &Arc<Self>) -> Result<Subscription, TooManySubscribers> {
        let max = self.settings.max_subscribers;
        if self.subscribers.fetch_add(1, Ordering::AcqRel) >= max {
            self.subscribers.fetch_sub(1, Ordering::AcqRel);
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(TooManySubscribers(max));
        }
        let number = self.subscriptions.fetch_add(1, Ordering::Relaxed);
        let (history, cursor) = {
            let ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
            let skip = ring.len().saturating_sub(self.settings.history);
            let cursor = Arc::new(AtomicU64::new(self.next_seq.load(Ordering::Relaxed)));
            // Registered under the ring's lock: no event is dropped between reading the cursor and
            // counting it.
            self.cursors.lock().unwrap_or_else(|p| p.into_inner()).push((number, cursor.clone()));
            (ring.iter().skip(skip).cloned().collect(), cursor)
        };
        Ok(Subscription {
            hub: self.clone(),
            number,
            history,
            cursor,
            head: self.head.subscribe(),
            closed: self.closed.subscribe(),
        })
    }

    /// Ends every subscription once it has taken what the hub still holds for it (the agent is
    /// stopping); later subscriptions end after their history.
    pub fn close(&self) {
        self.flush();
        self.closed.send_replace(true);
    }

    /// Does `p` pass `filters`? From its key where that decides, else from the event decoded out
    /// of its bytes; an event that does not decode (never expected) is counted and not sent.
    pub fn matches(&self, p: &Published, filters: &Filters) -> bool {
        if let Some(decided) = filters.matches_key(&p.key) {
            return decided;
        }
        self.decoded.fetch_add(1, Ordering::Relaxed);
        match p.event() {
            Some(ev) => filters.matches(&ev),
            None => {
                if self.undecodable.fetch_add(1, Ordering::Relaxed) == 0 {
                    tracing::warn!(
                        seq = p.seq,
                        "an event the API hub holds does not decode; skipped (counted from now on)"
                    );
                }
                false
            }
        }
    }

    /// Events decoded so far because a subscriber's filters needed more than their key.
    pub fn decoded(&self) -> u64 {
        self.decoded.load(Ordering::Relaxed)
    }

    /// Events skipped because their bytes did not decode (0 unless something is badly wrong).
    pub fn undecodable(&self) -> u64 {
        self.undecodable.load(Ordering::Relaxed)
    }

    /// The number of the oldest event the hub holds (`None` before the first).
    fn oldest_seq(&self) -> Option<u64> {
        self.ring.lock().unwrap_or_else(|p| p.into_inner()).front().map(|p| p.seq)
    }

    /// What the hub did so far. `lost` counts what subscribers were told they lost and what
    /// connected subscribers that are behind have missed without having read since (those
    /// between a subscriber's cursor and the oldest event held), so a subscriber that never reads
    /// is not shown as losing nothing. Never decreases: a subscriber moves what it is told from one
    /// part to the other under the lock this reads both under.
    pub fn stats(&self) -> HubStats {
        let oldest = self.oldest_seq();
        let lost = {
            let cursors = self.cursors.lock().unwrap_or_else(|p| p.into_inner());
            let behind: u64 = match oldest {
                Some(o) => cursors.iter().map(|(_, c)| o.saturating_sub(c.load(Ordering::Relaxed))).sum(),
                None => 0,
            };
            self.lost.load(Ordering::Relaxed) + behind
        };
        HubStats {
            published: self.next_seq.load(Ordering::Relaxed) - 1,
            subscribers: self.subscribers.load(Ordering::Relaxed) as u64,
            subscriptions: self.subscriptions.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            lost,
            connections: Default::default(),
        }
    }

    /// Up to `max` events from number `cursor` on, or how many before the oldest held are gone.
    fn take(&self, cursor: u64, max: usize) -> Result<Vec<Published>, u64> {
        let ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let Some(oldest) = ring.front().map(|p| p.seq) else { return Ok(Vec::new()) };
        if cursor < oldest {
            return Err(oldest - cursor);
        }
        let from = usize::try_from(cursor - oldest).unwrap_or(usize::MAX);
        Ok(ring.iter().skip(from).take(max).cloned().collect())
    }
}

/// What a subscriber receives next.
#[derive(Debug)]
pub enum Received {
    /// The next events, in order (at least one).
    Events(Vec<Published>),
    /// This many events were missed (the subscriber fell behind); the next is the oldest held.
    Lost(u64),
    /// The agent is stopping.
    Closed,
}

/// One subscriber's view of the hub. Dropping it frees its place.
#[derive(Debug)]
pub struct Subscription {
    hub: Arc<EventHub>,
    /// Its number among the hub's subscriptions (where its cursor is registered).
    number: u64,
    /// The history when it subscribed, oldest first.
    pub history: Vec<Published>,
    /// The number of the next event it receives (the hub reads it for [`EventHub::stats`]).
    cursor: Arc<AtomicU64>,
    head: watch::Receiver<u64>,
    closed: watch::Receiver<bool>,
}

impl Subscription {
    /// The hub it reads.
    pub fn hub(&self) -> &EventHub {
        &self.hub
    }

    /// The number of the next event it receives.
    pub fn cursor(&self) -> u64 {
        self.cursor.load(Ordering::Relaxed)
    }

    /// The next events after the history, at most `max` at a time (waits for at least one).
    pub async fn recv(&mut self, max: usize) -> Received {
        loop {
            // Once the agent stops, what is still held is handed out (the server's shutdown
            // deadline bounds how long that may take), then the stream ends.
            let closed = *self.closed.borrow();
            // Marked seen before looking, so a flush after the look wakes the wait below.
            self.head.borrow_and_update();
            match self.hub.take(self.cursor(), max.max(1)) {
                Err(lost) => {
                    // Moved from "behind" to "told" at once, under the lock `stats` reads both under.
                    let _cursors = self.hub.cursors.lock().unwrap_or_else(|p| p.into_inner());
                    self.hub.lost.fetch_add(lost, Ordering::Relaxed);
                    self.cursor.fetch_add(lost, Ordering::Relaxed);
                    return Received::Lost(lost);
                }
                Ok(events) if !events.is_empty() => {
                    self.cursor.store(events[events.len() - 1].seq + 1, Ordering::Relaxed);
                    return Received::Events(events);
                }
                Ok(_) if closed => return Received::Closed,
                Ok(_) => {}
            }
            tokio::select! {
                r = self.head.changed() => if r.is_err() { return Received::Closed },
                _ = self.closed.wait_for(|c| *c) => return Received::Closed,
            }
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        // What it had lost without being told stays counted. (The ring's lock is not held while
        // the cursors' is taken: `subscribe` takes them the other way round.)
        let oldest = self.hub.oldest_seq();
        let mut cursors = self.hub.cursors.lock().unwrap_or_else(|p| p.into_inner());
        cursors.retain(|(n, _)| *n != self.number);
        let behind = oldest.map_or(0, |o| o.saturating_sub(self.cursor()));
        self.hub.lost.fetch_add(behind, Ordering::Relaxed);
        drop(cursors);
        self.hub.subscribers.fetch_sub(1, Ordering::AcqRel);
    }
}
