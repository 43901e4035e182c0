//! Test doubles for gpu-tracer.
//!
//! * [`fake_driver`]: a fake NVIDIA kernel driver served over FUSE (`fake-nvidia-driver`), which
//!   answers the frontend ioctls like the real driver and keeps inspectable per-mount state.
//! * [`workload`]: `nv-workload`, a program that issues a CUDA application's ioctl sequences one
//!   phase per stdin command.

pub mod fake_driver;
pub mod le;
pub mod workload;

pub use fake_driver::DriverStats;
