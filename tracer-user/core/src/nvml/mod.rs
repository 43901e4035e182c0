//! NVML: the device-level and per-process readings the attribution engine splits, as plain data
//! ([`model`]); the agent's `nvml::sampler` reads them through nvml-wrapper.
pub mod model;
