//! The agent's gRPC API (`proto/gputracer/v1/api.proto`, service `gputracer.v1.GpuTracer`).
//!
//! - [`authority`]: on the Unix socket, the `:authority` standard gRPC clients send there (the
//!   socket path) replaced by one h2 accepts.
//! - [`hub`]: every event the agent emits, fanned out to subscribers with a bounded history;
//!   a subscriber that falls behind is told how many events it lost, the agent never waits.
//!
//! The subscription filters and the snapshot and status as messages are `tracer_core::wire`'s.
pub mod accept;
pub(crate) mod authority;
pub mod hub;
pub mod listen;
pub mod profiles;
pub mod service;

#[cfg(test)]
mod tests;
