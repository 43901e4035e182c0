//! Profiling sessions on this node's probes: resolving the workload ([`target`]), a standalone
//! session's recording loop ([`session`]), and the sessions the agent serves to `profile
//! --connect` ([`desk`]). What is recorded is `tracer_core::profile`'s; what is written, the
//! client's.
pub(crate) mod desk;
pub mod session;
pub mod target;
