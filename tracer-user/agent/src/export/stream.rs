//! What the pipeline adds to an event stream beside each decoded event: the launches the kernel
//! counted since the last batch and the guardrail violations raised since, as `gputracer.v1`
//! events. The agent's hub and OTLP queue take them (`crate::node`), and so does `gpu-tracer
//! events`'s writer: both are an [`Emit`].
use std::time::Duration;

use gpu_tracer_proto::v1;
use tracer_core::wire::events::{launch_batch_to_proto, violation_to_proto};

use crate::pipeline::Agent;

/// Where the events of a tick go.
pub trait Emit {
    /// Does it take events now? (When not, the message is not built.)
    fn wants(&self) -> bool;
    fn emit(&mut self, ev: v1::Event);
}

/// Launches counted in the kernel since the last batch (`interval` ago), one event per process
/// and entry point.
pub fn launch_batches(out: &mut impl Emit, agent: &mut Agent, interval: Duration) {
    for (k, n) in agent.launch_batches() {
        if out.wants() {
            let (now, e) = agent.context_now(k.tgid, k.cgroup_id);
            let interval_ns = interval.as_nanos() as u64;
            out.emit(launch_batch_to_proto(k.tgid, k.cgroup_id, k.entry, n, interval_ns, now, &e));
        }
    }
}

/// The violations the guardrails raised since the last call, one event each.
pub fn violations(out: &mut impl Emit, agent: &mut Agent) {
    for v in agent.take_new_violations() {
        if out.wants() {
            let cgroup_id = agent.cgroup_of_container(&v.namespace, &v.pod, &v.container).unwrap_or(0);
            let (now, e) = agent.context_now(v.pid, cgroup_id);
            out.emit(violation_to_proto(&v, cgroup_id, now, &e));
        }
    }
}
