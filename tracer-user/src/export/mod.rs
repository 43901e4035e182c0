//! The last pipeline stage: what leaves the tracer.
//!
//! - [`events`]: decoded events as the versioned `gputracer.v1` protobuf schema, written as a
//!   length-delimited stream or as JSON lines (`gpu-tracer events`).
pub mod events;
pub mod top;
