//! Shared by the fuzz target and the seed-corpus writer: the input format, which lives in
//! `tracer_core::decode::fuzz` (the unit test replaying the corpus uses it too).
pub use tracer_core::{decode::{fuzz::{split, VERSIONS}}};
