//! Attribution: each GPU's memory, compute, energy and cost split between containers, in named
//! lines that add up exactly to the device and to the bill (DESIGN.md "Attribution").
//!
//! - [`input`]: what one interval says, as plain data, and [`input_from_sample`] building it from
//!   two NVML samples plus the tracer's PID → container map, ledgers and launch counts.
//! - [`gpu`]: the pure per-GPU, per-interval split ([`attribute_gpu`], [`detect_sharing_mode`]).
//! - [`attributor`]: the [`Attributor`], which keeps the bill so far, idle reservations and the
//!   rightsizing history, and returns an immutable [`AttributionSnapshot`] each interval.
//! - [`rightsizing`]: MIG profile tables and what would fit.
//! - [`split`]: the largest-remainder split every line is made with (integers, exact sums).
//!
//! Units: bytes, millipercent (100 % = 100 000), millijoules, nano-currency (10⁻⁹ of the price's
//! currency), all integers.
pub mod attributor;
pub mod gpu;
pub mod input;
pub mod rightsizing;
pub mod split;

#[cfg(test)]
mod tests;

pub use attributor::{AttributionSnapshot, Attributor, Bill, ContainerSummary, IdleReservation};
pub use gpu::{GpuAttribution, SharingMode, attribute_gpu, detect_sharing_mode};
pub use input::{
    AttributionInput, ContainerInput, ContainerKey, GpuInput, GpuRequest, ProcessInput, ProcessLedgers, ProcessOwner,
    input_from_sample,
};

/// Nano-currency as currency with at least 2 decimals (more for amounts under a cent, so a
/// one-second interval's cost is not shown as 0.00). Rounded half up.
pub fn format_currency(nano: u64) -> String {
    let decimals = if nano >= 10_000_000 {
        2
    } else if nano >= 100_000 {
        4
    } else {
        6
    };
    format_fixed(nano, decimals)
}

/// Nano-currency with exactly `decimals` (0..=9) decimals, rounded half up.
pub fn format_fixed(nano: u64, decimals: u32) -> String {
    let decimals = decimals.min(9);
    let unit = 10u128.pow(9 - decimals);
    let v = (nano as u128 + unit / 2) / unit;
    let scale = 10u128.pow(decimals);
    if decimals == 0 {
        format!("{v}")
    } else {
        format!("{}.{:0width$}", v / scale, v % scale, width = decimals as usize)
    }
}
