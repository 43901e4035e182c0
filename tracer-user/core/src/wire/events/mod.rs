//! Decoded events as `gputracer.v1.Event` messages (see `proto/gputracer/v1/events.proto`).
//!
//! [`to_proto`] maps every [`Event`] and every [`IoctlOp`] onto the schema. Operations without a
//! dedicated message become [`v1::OtherIoctl`] (frontend escapes and other NVIDIA nodes) or
//! [`v1::UvmOther`] (UVM commands), so every ioctl is still counted by consumers. [`to_json`] is the
//! readable form of the same message.
//!
//! What the decoded event does not carry is written as the schema's zero ("unknown"): the raw
//! NVOS32/NVOS02 `flags`/`attr`, `RmControl.params_size`, `RmMapMemory.linear_address`, and
//! `OtherIoctl.size` for commands that came through `NV_ESC_IOCTL_XFER_CMD` (the event keeps only
//! the outer command). `NV_ESC_RM_ALLOC_OBJECT` allocations have form `UNSPECIFIED`: v1 has no value
//! for NVOS05.
//!
//! One file per job: `proto` (decoded event → message), `json` (message → JSON).
//!
//! [`Event`]: crate::decode::Event
//! [`IoctlOp`]: crate::decode::IoctlOp
//! [`v1::OtherIoctl`]: gpu_tracer_proto::v1::OtherIoctl
//! [`v1::UvmOther`]: gpu_tracer_proto::v1::UvmOther

mod json;
mod proto;

pub use json::to_json;
pub(crate) use proto::container_proto;
pub use proto::{kind_of, launch_batch_to_proto, to_proto, violation_to_proto};

#[cfg(test)]
mod tests;
