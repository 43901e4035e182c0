//! gpu-tracer's client side: what reads the model (`tracer_core`) and shows or writes it, never a
//! probe: the agent's gRPC API client ([`api`]), `top`'s tables ([`top`], [`attribution_table`],
//! [`table`]), the event stream writer ([`events`]), `cost`'s sources and report ([`cost`]), and a
//! profiling session's trace, summary and HTML report ([`profile`]).
pub mod api;
pub mod attribution_table;
pub mod cost;
pub mod events;
pub mod profile;
pub mod table;
pub mod top;
