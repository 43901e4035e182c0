//! How each probe family fared, as `/readyz`, `/metrics` and `top --json` show it.
use serde::Serialize;

use crate::probe::{FamilyStatus, ProbeReport};

/// One probe family (`driver`, `lifecycle`, `cuda`) and how it fared.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProbeFamilyState {
    /// `driver`, `lifecycle` or `cuda`.
    pub family: &'static str,
    pub status: FamilyStatus,
}

impl ProbeFamilyState {
    /// The three families of a probe report, in the order `doctor` lists them.
    pub fn of_report(r: &ProbeReport) -> Vec<Self> {
        [("driver", &r.driver), ("lifecycle", &r.lifecycle), ("cuda", &r.cuda)]
            .into_iter()
            .map(|(family, status)| ProbeFamilyState { family, status: status.clone() })
            .collect()
    }

    /// `attached`, `disabled` (by configuration), `failed`, or `nothing_to_probe` (the cuda family
    /// on a node without libcuda: not a fault of the probes).
    pub fn state(&self) -> &'static str {
        match self.status {
            FamilyStatus::Attached { .. } => "attached",
            FamilyStatus::Disabled => "disabled",
            FamilyStatus::Failed { .. } => "failed",
            FamilyStatus::NothingToProbe { .. } => "nothing_to_probe",
        }
    }

    /// Why a family that was switched on failed to attach; `None` when attached, switched off, or
    /// with nothing to probe. Such a failure makes `/readyz` answer 503.
    pub fn failure(&self) -> Option<&str> {
        match &self.status {
            FamilyStatus::Failed { error } => Some(error),
            _ => None,
        }
    }
}
