//! NVML: the device-level and per-process readings the attribution engine splits.
//! `model` is the plain data of one sample.
pub mod model;
