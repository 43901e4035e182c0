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
pub use gpu::{GpuAttribution, SharingMode};
pub use input::{
    AttributionInput, ContainerInput, ContainerKey, GpuInput, GpuRequest, ProcessInput, ProcessLedgers, ProcessOwner,
    input_from_sample,
};

#[cfg(test)]
/// Nano-currency as currency with at least 2 decimals (more for amounts under a cent, so a
/// one-second interval's cost is not shown as 0.00). Rounded half up.
pub(crate) fn format_currency(nano: u64) -> String {
    format_fixed(nano, currency_decimals(nano))
}

/// Decimals [`format_currency`] gives `nano`: 2 from a cent up, 4 from 0.0001, 6 below.
fn currency_decimals(nano: u64) -> u32 {
    if nano >= 10_000_000 {
        2
    } else if nano >= 100_000 {
        4
    } else {
        6
    }
}

/// A total and its parts as currency printed together: one precision for all of them (enough
/// that no part that is not zero shows as zero), the total rounded half up, and the parts split
/// from the printed total with the largest-remainder rule by their exact amounts, so the printed
/// parts add up to the printed total. (`total` is Σ `parts` wherever it is used: the bill.)
pub fn format_currency_parts(total: u64, parts: &[u64]) -> (String, Vec<String>) {
    let decimals = parts.iter().filter(|p| **p > 0).chain([&total]).map(|v| currency_decimals(*v)).max().unwrap_or(2);
    let unit = 10u128.pow(9 - decimals);
    let shown_total = ((total as u128 + unit / 2) / unit).min(u64::MAX as u128) as u64;
    let weights: Vec<u128> = parts.iter().map(|p| *p as u128).collect();
    let shown = split::split_exact(shown_total, &weights).unwrap_or_else(|| vec![0; parts.len()]);
    let fmt = |units: u64| format_fixed(units.saturating_mul(unit as u64), decimals);
    (fmt(shown_total), shown.into_iter().map(fmt).collect())
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
