//! The decode fuzz target's input format and oracles, shared by the target (`fuzz/`, run by
//! `cargo xtask reliability` for ≥ 10 M executions) and by the unit test that replays the kept
//! corpus (`fuzz/corpus/decode`) in every CI run.
//!
//! An input is one selector byte followed by the raw record: the selector picks the driver layout
//! (`DriverAbi`) the record is decoded with, so layout-dependent paths (NVOS64 40/48, UVM tails
//! at 1184/9248, UVM_FREE status at 16/8, NV_MEMORY_ALLOCATION_PARAMS 120/128) are all reached.
use tracer_common::nv::{DriverAbi, DriverVersion};

use super::{Event, IoctlOp, decode, encode};

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

/// The oracles on one input: decoding never panics (whatever the bytes), a malformed ioctl never
/// counts as a success, and whatever decodes re-encodes to a record that decodes to the same
/// event. Panics when one does not hold (the fuzzer's crash); returns whether the input decoded.
pub fn check(data: &[u8]) -> bool {
    let (abi, bytes) = split(data);
    let Ok(ev) = decode(bytes, &abi) else { return false };
    if let Event::Ioctl(e) = &ev
        && matches!(e.op, IoctlOp::Malformed { .. })
    {
        assert!(!e.succeeded(), "a malformed ioctl counted as a success: {e:?}");
    }
    let again = encode::event(&ev, &abi);
    assert_eq!(decode(&again, &abi), Ok(ev), "re-encoding changed the event");
    true
}
