//! The agent's gRPC API (`proto/gputracer/v1/api.proto`, service `gputracer.v1.GpuTracer`).
//!
//! - [`snapshot`]: the snapshot and status as protobuf messages (both directions: the agent
//!   serves them, `top --connect` renders them).
pub mod snapshot;
