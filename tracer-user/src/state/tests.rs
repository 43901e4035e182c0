//! State tests.
