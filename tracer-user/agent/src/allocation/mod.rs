//! Which GPUs the kubelet gave each container: its pod-resources socket ([`pod_resources`]: the
//! gRPC client) polled by [`source`]; the answer is parsed by `tracer_core::allocation`.
pub mod pod_resources;
pub mod source;
