//! Shared by the fuzz target and the seed-corpus writer: the input format.
//!
//! An input is one selector byte followed by the raw record: the selector picks the driver layout
//! (`DriverAbi`) the record is decoded with, so layout-dependent paths (NVOS64 40/48, UVM tails
//! at 1184/9248, UVM_FREE status at 16/8, NV_MEMORY_ALLOCATION_PARAMS 120/128) are all reached.
use tracer_common::nv::{DriverAbi, DriverVersion};

/// The driver versions a selector byte maps to (`selector % len`).
pub const VERSIONS: [DriverVersion; 4] = [
    DriverVersion::new(530, 41, 3),
    DriverVersion::new(535, 261, 3),
    DriverVersion::new(550, 54, 15),
    DriverVersion::new(595, 45, 4),
];

/// Split a fuzz input into the layout and the record bytes.
pub fn split(data: &[u8]) -> (DriverAbi, &[u8]) {
    let (sel, rest) = data.split_first().map_or((0, &[][..]), |(s, r)| (*s, r));
    (DriverAbi::for_version(VERSIONS[sel as usize % VERSIONS.len()]), rest)
}
