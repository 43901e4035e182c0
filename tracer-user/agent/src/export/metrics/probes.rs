//! Each probe family's state: `probe_family_up` (alert on 0) and `probe_family_info` (which state).
use std::fmt;

use super::{MetricEncoder, Scrape, gauge_family};

/// `gpu_tracer_probe_family_up{family}`: 1 attached, 0 failed or nothing to probe; a family
/// switched off by configuration has no series, so `== 0` alerts only on what was meant to run.
/// `gpu_tracer_probe_family_info{family, state}`: 1 for the state each family is in. The reason
/// of a failure is free text: it is in `/readyz`, the log and `doctor`, not in a label.
pub fn probe_families(s: &Scrape<'_>, e: &mut dyn MetricEncoder) -> fmt::Result {
    let families = &s.snapshot.probe_families;
    gauge_family(
        e,
        "probe_family_up",
        "1 when a probe family that is switched on is attached, 0 when it failed (or found nothing to probe); \
         families switched off have no series.",
        None,
        families
            .iter()
            .filter(|f| f.state() != "disabled")
            .map(|f| ([("family", f.family)], u64::from(f.state() == "attached"))),
    )?;
    gauge_family(
        e,
        "probe_family_info",
        "Each probe family's state (value 1): attached, disabled, failed or nothing_to_probe; /readyz, the log \
         and doctor say why.",
        None,
        families.iter().map(|f| ([("family", f.family), ("state", f.state())], 1u64)),
    )
}
