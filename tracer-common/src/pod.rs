use super::*;
// SAFETY: DeviceRef is #[repr(C)] with only integer fields (u8, u32, u64) and its padding as the explicit
// `_pad: [u8; 3]` field (size asserted to be 16 above), so every byte is initialised and any bit pattern
// is valid.
unsafe impl aya::Pod for DeviceRef {}
// SAFETY: FdKey is #[repr(C)] with two u32 fields and no padding (size asserted to be 8), so any bit
// pattern is a valid value.
unsafe impl aya::Pod for FdKey {}
// SAFETY: Inflight is #[repr(C)] of integers, a u64 array and two DeviceRefs (themselves Pod); its size
// is asserted to be the sum of its fields, so it has no implicit padding and any bit pattern is valid.
unsafe impl aya::Pod for Inflight {}
// SAFETY: UvmMapKey is #[repr(C)] with u32/u64 fields and the explicit `_pad: u32` (size asserted to be
// 16), so it has no implicit padding and any bit pattern is valid.
unsafe impl aya::Pod for UvmMapKey {}
// SAFETY: CaptureKey is #[repr(C)] with two u32 fields and no padding (size asserted to be 8), so any bit
// pattern is valid.
unsafe impl aya::Pod for CaptureKey {}
// SAFETY: CapturePlan is #[repr(C)] with eight u32 fields, the last the explicit `_pad` (size asserted to
// be 32), so it has no implicit padding and any bit pattern is valid.
unsafe impl aya::Pod for CapturePlan {}
// SAFETY: PlanSlot is #[repr(C)] of two u32 fields and a CapturePlan (itself Pod, u32s only; size
// asserted to be 40), so it has no implicit padding and any bit pattern is valid.
unsafe impl aya::Pod for PlanSlot {}
// SAFETY: ClassSize is #[repr(C)] with two u32 fields (size asserted to be 8), so any bit pattern is
// valid.
unsafe impl aya::Pod for ClassSize {}
// SAFETY: TracerConfig is #[repr(C)] with four u32 fields, a byte array and a DeviceCheck of u32s only
// (size asserted to be their sum), so it has no implicit padding and any bit pattern is valid.
unsafe impl aya::Pod for TracerConfig {}
// SAFETY: SimDeviceKey is #[repr(C)] with two u32 fields and a u64 (size asserted to be 16), so it has no
// implicit padding and any bit pattern is valid.
unsafe impl aya::Pod for SimDeviceKey {}
// SAFETY: CudaCountKey is #[repr(C)] with a u64 and two u32 fields (size asserted to be 16), so it has no
// implicit padding and any bit pattern is valid.
unsafe impl aya::Pod for CudaCountKey {}
// SAFETY: CudaCount is #[repr(C)] with two u64 fields (size asserted to be 16), so any bit pattern is
// valid.
unsafe impl aya::Pod for CudaCount {}
// SAFETY: CudaAllocInflight is #[repr(C)] with three u64 and two u32 fields, the last the explicit `_pad`
// (size asserted to be 32), so it has no implicit padding and any bit pattern is valid.
unsafe impl aya::Pod for CudaAllocInflight {}
// SAFETY: CudaTimedInflight is #[repr(C)] with five u64s, a u32 and the explicit `_pad: u32` (size
// asserted to be 48), so it has no implicit padding and any bit pattern is valid.
unsafe impl aya::Pod for CudaTimedInflight {}
// SAFETY: PerEventKey is #[repr(C)] with a u32, the explicit `_pad: u32` and a u64 (size asserted to be
// 16), so it has no implicit padding and any bit pattern is valid.
unsafe impl aya::Pod for PerEventKey {}
