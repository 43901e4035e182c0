//! The bill in the event stream: `Bill` events, an agent process's bill so far, written once a
//! minute by the agent and by `gpu-tracer events` (and read back by `gpu-tracer cost --events`).
//!
//! Per agent process (`node`, `agent_start_unix_ns`), the bill over a recording is its last `Bill`
//! minus its first one, or its last one alone where the recording holds the process's very first
//! `Bill` (`first`: it covers the process's whole life). Integers throughout: the rows add up as
//! the agent's own bill does.
use std::time::Duration;

use gpu_tracer_proto::v1::{self, event::Payload};

use super::Line;
use crate::model::AgentSnapshot;

/// How often the agent writes its bill into the stream.
pub(crate) const BILL_EVERY: Duration = Duration::from_secs(60);

/// Builds `Bill` events for one agent process.
#[derive(Clone, Debug)]
pub struct BillWriter {
    node: String,
    agent_start_unix_ns: u64,
    written: u64,
    last_end_unix_ns: u64,
}

impl BillWriter {
    /// `node` names this node in the bill; `agent_start_unix_ns` tells this process apart from
    /// the node's other agent processes (its start time).
    pub fn new(node: String, agent_start_unix_ns: u64) -> BillWriter {
        BillWriter { node, agent_start_unix_ns, written: 0, last_end_unix_ns: 0 }
    }

    /// The bill in `snap` as an event, when it has one (a price, a complete interval) and
    /// [`BILL_EVERY`] has passed (in attribution time) since the last one written; `None` otherwise.
    pub fn due(&mut self, snap: &AgentSnapshot, wall_time_unix_ns: u64) -> Option<v1::Event> {
        let a = snap.attribution.as_deref()?;
        let end = a.start_unix_ns.saturating_add(a.interval_ns);
        if a.interval_ns == 0 || (self.written > 0 && end < self.last_end_unix_ns + BILL_EVERY.as_nanos() as u64) {
            return None;
        }
        let ev = self.event(snap, wall_time_unix_ns)?;
        self.written += 1;
        self.last_end_unix_ns = end;
        Some(ev)
    }

    /// The bill in `snap` as an event, whenever it has one (the end of a recording).
    pub fn event(&self, snap: &AgentSnapshot, wall_time_unix_ns: u64) -> Option<v1::Event> {
        let a = snap.attribution.as_deref()?;
        if a.interval_ns == 0 {
            return None;
        }
        let input = super::from_snapshot(snap, &self.node).ok()?;
        let mut bill = v1::NodeBill {
            node: self.node.clone(),
            agent_start_unix_ns: self.agent_start_unix_ns,
            end_unix_ns: a.start_unix_ns.saturating_add(a.interval_ns),
            price_per_gpu_hour: a.price_per_gpu_hour.unwrap_or_default(),
            first: self.written == 0,
            total_nano: a.bill.total,
            ..Default::default()
        };
        for c in input.charges {
            let nano = u64::try_from(c.nano).unwrap_or(0);
            match c.line {
                Line::Container => bill.containers.push(v1::BillCharge {
                    namespace: c.namespace,
                    pod: c.pod,
                    container: c.container,
                    labels: c.labels.into_iter().collect(),
                    nano,
                }),
                Line::Idle => bill.idle_nano = nano,
                Line::DriverReserved => bill.driver_reserved_nano = nano,
                Line::Unattributed => bill.unattributed_nano = nano,
                Line::Evicted => bill.evicted_nano = nano,
            }
        }
        Some(v1::Event {
            header: Some(v1::Header {
                kind: v1::EventKind::Bill as i32,
                wall_time_unix_ns,
                tgid: std::process::id(),
                pid: std::process::id(),
                ..Default::default()
            }),
            payload: Some(Payload::Bill(bill)),
            ..Default::default()
        })
    }
}
