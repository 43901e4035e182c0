//! NVML: the device-level and per-process readings the attribution engine splits.
//! `model` is the plain data of one sample; `sampler` reads it from NVML.
pub mod model;
pub mod sampler;
