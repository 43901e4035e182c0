//! Fuzz `tracer_user::decode::decode` on raw ring-buffer records.
//!
//! Oracles: decoding never panics (whatever the bytes), a malformed ioctl never counts as a
//! success, and whatever decodes re-encodes to a record that decodes to the same event.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer_user::decode::{self, Event, IoctlOp};

fuzz_target!(|data: &[u8]| {
    let (abi, bytes) = gpu_tracer_fuzz::split(data);
    let Ok(ev) = decode::decode(bytes, &abi) else { return };
    if let Event::Ioctl(e) = &ev
        && matches!(e.op, IoctlOp::Malformed { .. })
    {
        assert!(!e.succeeded(), "a malformed ioctl counted as a success: {e:?}");
    }
    let again = decode::encode::event(&ev, &abi);
    assert_eq!(decode::decode(&again, &abi), Ok(ev), "re-encoding changed the event");
});
