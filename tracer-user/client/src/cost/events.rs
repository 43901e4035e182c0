//! The bill over a recording read back from an `events` file (`gpu-tracer cost --events FILE`):
//! the `Bill` events the agent and `gpu-tracer events` write ([`tracer_core::cost::bill::BillWriter`]).
//!
//! Per agent process (`node`, `agent_start_unix_ns`), the bill over the recording is its last
//! `Bill` minus its first one, or its last one alone where the file holds the process's very first
//! `Bill` (`first`: it covers the process's whole life, as a recording that started with the agent
//! does). Integers throughout: the rows add up as the agent's own bill does.
use std::{
    collections::BTreeMap,
    io::{self, Read},
};

use gpu_tracer_proto::v1::{self, event::Payload};
use prost::Message as _;

use tracer_core::cost::{Charge, CostInput, Line};

/// Why an events file could not be read as a bill.
#[derive(Debug, thiserror::Error)]
pub enum EventsCostError {
    #[error("reading {path}: {source}")]
    Read { path: String, source: io::Error },
    #[error(
        "{path} is JSON (`gpu-tracer events --json`); cost reads the protobuf stream: record with `gpu-tracer events \
         -o FILE` (no --json)"
    )]
    Json { path: String },
    #[error("{path}: not a gpu-tracer event stream at byte {offset} ({why})")]
    Garbage { path: String, offset: usize, why: String },
    #[error(
        "{path}: no Bill events in {events} events: it was recorded without a price (set \
         attribution.price_per_gpu_hour; the bill also needs NVML), for less than the first attribution interval, \
         or with filters that left the bill out (`--kind` without EVENT_KIND_BILL, `--namespace`…)"
    )]
    NoBill { path: String, events: u64 },
}

/// One agent process's first and last bill in the file.
struct Span {
    first: v1::NodeBill,
    last: v1::NodeBill,
    bills: u64,
}

/// The bill over the recording in `path` (a `gpu-tracer events` protobuf stream).
pub fn from_file(path: &str) -> Result<CostInput, EventsCostError> {
    let mut data = Vec::new();
    let read = |e| EventsCostError::Read { path: path.to_owned(), source: e };
    if path == "-" {
        io::stdin().read_to_end(&mut data).map_err(read)?;
    } else {
        std::fs::File::open(path).and_then(|mut f| f.read_to_end(&mut data)).map_err(read)?;
    }
    from_bytes(&data, path)
}

/// The bill over the recording `data` (named `path` in messages).
pub fn from_bytes(data: &[u8], path: &str) -> Result<CostInput, EventsCostError> {
    if data.first() == Some(&b'{') {
        return Err(EventsCostError::Json { path: path.to_owned() });
    }
    let mut warnings = Vec::new();
    let mut spans: BTreeMap<(String, u64), Span> = BTreeMap::new();
    let (mut events, mut offset) = (0u64, 0usize);
    while offset < data.len() {
        let mut rest = &data[offset..];
        let before = rest.len();
        let ev = match v1::Event::decode_length_delimited(&mut rest) {
            Ok(ev) => ev,
            Err(e) => {
                if events > 0 && truncated(&data[offset..]) {
                    warnings.push(format!(
                        "the file ends inside an event (a recording cut short): its last {} bytes were not read",
                        data.len() - offset
                    ));
                    break;
                }
                return Err(EventsCostError::Garbage { path: path.to_owned(), offset, why: e.to_string() });
            }
        };
        offset += before - rest.len();
        events += 1;
        let Some(Payload::Bill(b)) = ev.payload else { continue };
        match spans.entry((b.node.clone(), b.agent_start_unix_ns)) {
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(Span { first: b.clone(), last: b, bills: 1 });
            }
            std::collections::btree_map::Entry::Occupied(mut o) => {
                let s = o.get_mut();
                s.bills += 1;
                if b.end_unix_ns >= s.last.end_unix_ns {
                    s.last = b;
                }
            }
        }
    }
    if spans.is_empty() {
        return Err(EventsCostError::NoBill { path: path.to_owned(), events });
    }

    let mut charges = Vec::new();
    let mut prices: Vec<f64> = Vec::new();
    let (mut start, mut end) = (u64::MAX, 0u64);
    let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
    for ((node, _), s) in &spans {
        *per_node.entry(node).or_default() += 1;
        let whole_life = s.first.first;
        start = start.min(if whole_life { s.first.agent_start_unix_ns } else { s.first.end_unix_ns });
        end = end.max(s.last.end_unix_ns);
        if !prices.contains(&s.last.price_per_gpu_hour) {
            prices.push(s.last.price_per_gpu_hour);
        }
        let base = |f: fn(&v1::NodeBill) -> u64| if whole_life { 0 } else { f(&s.first) as i128 };
        let mut before: BTreeMap<(&str, &str, &str), i128> = BTreeMap::new();
        if !whole_life {
            for c in &s.first.containers {
                before.insert((&c.namespace, &c.pod, &c.container), c.nano as i128);
            }
        }
        for c in &s.last.containers {
            let nano = c.nano as i128 - before.remove(&(&c.namespace, &c.pod, &c.container)).unwrap_or(0);
            charges.push(Charge {
                node: node.clone(),
                line: Line::Container,
                namespace: c.namespace.clone(),
                pod: c.pod.clone(),
                container: c.container.clone(),
                labels: c.labels.clone().into_iter().collect(),
                nano,
            });
        }
        if !before.is_empty() {
            // A container in the first bill and not in the last: the agent evicted it (its cost
            // moved to the evicted line), which the difference of the lines carries.
            for ((ns, pod, container), nano) in before {
                charges.push(Charge {
                    node: node.clone(),
                    line: Line::Container,
                    namespace: ns.to_owned(),
                    pod: pod.to_owned(),
                    container: container.to_owned(),
                    labels: Default::default(),
                    nano: -nano,
                });
            }
        }
        for (line, f) in [
            (Line::Idle, (|b: &v1::NodeBill| b.idle_nano) as fn(&v1::NodeBill) -> u64),
            (Line::DriverReserved, |b| b.driver_reserved_nano),
            (Line::Unattributed, |b| b.unattributed_nano),
            (Line::Evicted, |b| b.evicted_nano),
        ] {
            charges.push(Charge::line(node, line, f(&s.last) as i128 - base(f)));
        }
        let sum: i128 = s.last.containers.iter().map(|c| c.nano as i128).sum::<i128>()
            + [s.last.idle_nano, s.last.driver_reserved_nano, s.last.unattributed_nano, s.last.evicted_nano]
                .iter()
                .map(|&n| n as i128)
                .sum::<i128>();
        if sum != s.last.total_nano as i128 {
            warnings.push(format!(
                "{node}: its last bill's lines add up to {sum} nano but its total says {} (a bug: please report it)",
                s.last.total_nano
            ));
        }
        if !whole_life {
            warnings.push(format!(
                "{node}: the recording started after its agent (process started at {}): its bill counts from its \
                 first Bill in the file ({}), up to a minute after the recording began",
                tracer_core::format::unix_time(s.first.agent_start_unix_ns),
                tracer_core::format::unix_time(s.first.end_unix_ns),
            ));
        }
    }
    for (node, n) in per_node.into_iter().filter(|(_, n)| *n > 1) {
        warnings.push(format!(
            "{node}: {n} agent processes in the recording (restarts); each one's last Bill is counted, the cost between \
             a process's last Bill and its end is not in the file"
        ));
    }
    Ok(CostInput {
        source: format!("the recorded events in {path} ({} agent processes, {events} events)", spans.len()),
        period: format!("from {} to {}", tracer_core::format::unix_time(start), tracer_core::format::unix_time(end)),
        start_unix_s: Some(start as f64 / 1e9),
        end_unix_s: Some(end as f64 / 1e9),
        prices_per_gpu_hour: prices,
        charges,
        warnings,
    })
}

/// Does `rest` start with a length prefix that promises more bytes than there are (a cut-off
/// last event), rather than bytes that are no event at all?
fn truncated(rest: &[u8]) -> bool {
    let mut r = rest;
    match prost::encoding::decode_varint(&mut r) {
        Ok(len) => len as usize > r.len(),
        Err(_) => rest.len() < 10 && rest.iter().all(|b| b & 0x80 != 0),
    }
}

#[cfg(test)]
mod tests;
