//! NVML on this node: [`sampler`] reads one sample (`tracer_core::nvml::model`) through
//! nvml-wrapper.
pub mod sampler;
