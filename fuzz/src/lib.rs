//! Shared by the fuzz target and the seed-corpus writer: the input format, which lives in
//! `tracer_user::decode::fuzz` (the unit test replaying the corpus uses it too).
pub use tracer_user::decode::fuzz::{VERSIONS, split};
