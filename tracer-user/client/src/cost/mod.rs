//! `gpu-tracer cost`'s sources and report: one agent's `/metrics` or a fleet's series in Prometheus
//! ([`series`], [`prometheus`]), the `Bill` events of a recorded stream ([`events`]), and the
//! report as a table, CSV or JSON ([`render`]). The bill's model and its grouping are
//! `tracer_core::cost`'s.
pub mod events;
pub mod prometheus;
pub mod render;
pub mod series;

#[cfg(test)]
mod tests;
