//! The agent's gRPC API (`proto/gputracer/v1/api.proto`, service `gputracer.v1.GpuTracer`).
//!
//! - [`hub`]: every event the agent emits, fanned out to subscribers with a bounded history;
//!   a subscriber that falls behind is told how many events it lost, the agent never waits.
//! - [`filter`]: the subscription filters, checked once and matched per event.
//! - [`profile`]: profiling sessions on the agent's probes (`profile --connect`).
//! - [`snapshot`]: the snapshot and status as protobuf messages (both directions: the agent
//!   serves them, `top --connect` renders them).
pub mod client;
pub mod filter;
pub mod hub;
pub mod listen;
pub mod profile;
pub mod service;
pub mod snapshot;

#[cfg(test)]
mod tests;
