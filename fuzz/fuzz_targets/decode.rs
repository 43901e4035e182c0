//! Fuzz `tracer_core::decode::decode` on raw ring-buffer records. The input format and the oracles
//! are `tracer_core::decode::fuzz` (shared with the unit test that replays the kept corpus in CI):
//! decoding never panics, a malformed ioctl never counts as a success, and whatever decodes
//! re-encodes to a record that decodes to the same event.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    tracer_core::decode::fuzz::check(data);
});
