//! What the kernel side copies from each ioctl argument, for one driver version.
//!
//! User space writes [`capture_plans`] into the `CAPTURE_PLANS` map and [`alloc_param_sizes`] into
//! `ALLOC_PARAM_SIZES` before attaching. Every command [`super::decode`] reads fields from has a plan
//! here, sized so that the window covers exactly the fields decoded (never more than the driver's
//! struct: a longer copy could run into an unmapped page after a small struct and fault).
//!
//! Frontend commands without a plan copy `min(_IOC_SIZE, IOCTL_MAIN_MAX)` bytes; UVM commands
//! without a plan copy nothing (UVM commands do not encode their size).

use tracer_common::{
    ALLOC_PARAM_SLOTS, CAPTURE_PLAN_SLOTS, CaptureKey, CapturePlan, ClassSize, IOCTL_MAIN_MAX, IOCTL_NESTED_MAX,
    NO_NESTED, PlanSlot, SPACE_FRONTEND, SPACE_UVM, class_slot,
    nv::{DriverAbi, class, esc, size, uvm},
    plan_slot,
};

/// A plan that copies the first `main_len` bytes and nothing else.
pub(crate) fn main_only(main_len: u32) -> CapturePlan {
    CapturePlan {
        main_len: main_len.min(IOCTL_MAIN_MAX as u32),
        tail_off: 0,
        tail_len: 0,
        nested_ptr_off: NO_NESTED,
        nested_len: 0,
        nested_by_class: 0,
        class_off: 0,
        ledger: 0,
    }
}

/// The same plan, its records marked for the ledger ring (`CapturePlan::ledger`).
fn ledger(p: CapturePlan) -> CapturePlan {
    CapturePlan { ledger: 1, ..p }
}

/// The capture plans for every command the decoder reads, for driver layouts `abi`. The commands
/// whose records change the memory ledger (allocations, frees, duplicates) are marked for the
/// ledger ring; the rest only count and go through the bulk ring.
pub fn capture_plans(abi: &DriverAbi) -> Vec<(CaptureKey, CapturePlan)> {
    let fe = |nr: u32| CaptureKey { space: SPACE_FRONTEND, cmd: nr };
    let uv = |cmd: u32| CaptureKey { space: SPACE_UVM, cmd };
    // RM_ALLOC comes in two sizes (NVOS21, NVOS64); the larger window covers both, and the kernel
    // copies at most `_IOC_SIZE` of it. pAllocParms (@16) is followed for as many bytes as the class
    // needs (ALLOC_PARAM_SIZES, keyed by hClass @12).
    let rm_alloc = CapturePlan {
        main_len: abi.nvos64_size.max(size::NVOS21),
        nested_ptr_off: tracer_common::nv::off::ALLOC_P_PARAMS as u32,
        nested_len: 0,
        nested_by_class: 1,
        class_off: tracer_common::nv::off::ALLOC_H_CLASS as u32,
        ..ledger(main_only(0))
    };
    let map_external = CapturePlan {
        main_len: uvm::MAP_EXTERNAL_HEAD,
        tail_off: abi.uvm_map_external_tail,
        tail_len: uvm::MAP_EXTERNAL_TAIL_LEN,
        ..main_only(0)
    };
    vec![
        // Frontend (nvidiactl / nvidiaN), keyed by the effective nr (XFER's inner nr included).
        (fe(esc::RM_ALLOC), rm_alloc),
        (fe(esc::RM_ALLOC_OBJECT), ledger(main_only(size::NVOS05))),
        (fe(esc::RM_FREE), ledger(main_only(size::NVOS00))),
        (fe(esc::RM_CONTROL), main_only(size::NVOS54)),
        (fe(esc::RM_DUP_OBJECT), ledger(main_only(size::NVOS55))),
        (fe(esc::RM_VID_HEAP_CONTROL), ledger(main_only(size::NVOS32))),
        (fe(esc::RM_ALLOC_MEMORY), ledger(main_only(size::NVOS02_WITH_FD))),
        (fe(esc::RM_MAP_MEMORY), main_only(size::NVOS33_WITH_FD)),
        (fe(esc::RM_UNMAP_MEMORY), main_only(size::NVOS34)),
        (fe(esc::REGISTER_FD), main_only(size::REGISTER_FD)),
        (fe(esc::CHECK_VERSION_STR), main_only(size::RM_API_VERSION)),
        // As many card-info entries as fit the window (3); libcuda passes room for 35.
        (fe(esc::CARD_INFO), main_only(IOCTL_MAIN_MAX as u32 / size::CARD_INFO_ENTRY * size::CARD_INFO_ENTRY)),
        // UVM (/dev/nvidia-uvm), keyed by the command.
        (uv(uvm::INITIALIZE), main_only(uvm::INITIALIZE_SIZE)),
        (uv(uvm::MM_INITIALIZE), main_only(uvm::MM_INITIALIZE_SIZE)),
        (uv(uvm::REGISTER_GPU), main_only(uvm::REGISTER_GPU_SIZE)),
        (uv(uvm::UNREGISTER_GPU), main_only(uvm::UNREGISTER_GPU_SIZE)),
        (uv(uvm::CREATE_EXTERNAL_RANGE), main_only(uvm::CREATE_EXTERNAL_RANGE_SIZE)),
        (uv(uvm::MAP_EXTERNAL_ALLOCATION), map_external),
        (uv(uvm::UNMAP_EXTERNAL), main_only(uvm::UNMAP_EXTERNAL_SIZE)),
        (uv(uvm::FREE), main_only(abi.uvm_free_size)),
        (uv(uvm::PAGEABLE_MEM_ACCESS), main_only(uvm::PAGEABLE_MEM_ACCESS_SIZE)),
        (uv(uvm::VALIDATE_VA_RANGE), main_only(uvm::VALIDATE_VA_RANGE_SIZE)),
    ]
}

/// Nested `pAllocParms` lengths by RM class, for driver layouts `abi` (each at most
/// `IOCTL_NESTED_MAX`). Classes not listed get no nested copy.
pub fn alloc_param_sizes(abi: &DriverAbi) -> Vec<(u32, u32)> {
    let cap = |n: u32| n.min(IOCTL_NESTED_MAX as u32);
    let mem = cap(abi.mem_alloc_params_size);
    vec![
        (class::NV01_MEMORY_LOCAL_USER, mem),
        (class::NV01_MEMORY_SYSTEM, mem),
        (class::NV01_MEMORY_DEVICELESS, mem),
        (class::NV50_MEMORY_VIRTUAL, mem),
        (class::NV01_MEMORY_LOCAL_PHYSICAL, cap(size::NV_PHYSICAL_MEMORY_ALLOCATION_PARAMS)),
        (class::NV_MEMORY_FABRIC, cap(size::NV00F8_ALLOCATION_PARAMETERS)),
        (class::NV01_MEMORY_SYSTEM_OS_DESCRIPTOR, cap(size::NV_OS_DESC_MEMORY_ALLOCATION_PARAMS)),
        (class::NV01_MEMORY_VIRTUAL, cap(size::NV_MEMORY_VIRTUAL_ALLOCATION_PARAMS)),
        (class::NV01_DEVICE_0, cap(size::NV0080_ALLOC_PARAMETERS)),
        (class::NV20_SUBDEVICE_0, cap(size::NV2080_ALLOC_PARAMETERS)),
    ]
}

/// `plans` as the kernel's `CAPTURE_PLANS` array: (slot, entry) per plan. Two commands of one space
/// whose low bytes agree would share a slot: an error naming both (a table for a new driver must
/// then change [`tracer_common::plan_slot`], which the tests check for every known layout).
pub fn plan_slots(plans: &[(CaptureKey, CapturePlan)]) -> Result<Vec<(u32, PlanSlot)>, String> {
    let mut out: Vec<(u32, PlanSlot)> = Vec::with_capacity(plans.len());
    for (k, p) in plans {
        let slot = plan_slot(k.space, k.cmd);
        debug_assert!(slot < CAPTURE_PLAN_SLOTS);
        if k.space > 1 {
            return Err(format!("capture plan for command {:#x} in unknown space {}", k.cmd, k.space));
        }
        if let Some((_, other)) = out.iter().find(|(s, _)| *s == slot) {
            return Err(format!(
                "capture plans for commands {:#x} and {:#x} (space {}) share slot {slot}",
                other.cmd, k.cmd, k.space
            ));
        }
        out.push((slot, PlanSlot { cmd: k.cmd, present: 1, plan: *p }));
    }
    Ok(out)
}

/// `sizes` as the kernel's `ALLOC_PARAM_SIZES` array: (slot, entry) per class; two classes in one
/// slot are an error naming both.
pub fn class_slots(sizes: &[(u32, u32)]) -> Result<Vec<(u32, ClassSize)>, String> {
    let mut out: Vec<(u32, ClassSize)> = Vec::with_capacity(sizes.len());
    for &(class, size) in sizes {
        let slot = class_slot(class);
        debug_assert!(slot < ALLOC_PARAM_SLOTS);
        if let Some((_, other)) = out.iter().find(|(s, _)| *s == slot) {
            return Err(format!("RM classes {:#x} and {class:#x} share nested-size slot {slot}", other.class));
        }
        out.push((slot, ClassSize { class, size }));
    }
    Ok(out)
}

#[cfg(any(test, feature = "encode"))]
/// The nested length [`alloc_param_sizes`] gives `class` (0 if none).
pub(crate) fn alloc_param_size(abi: &DriverAbi, class: u32) -> u32 {
    alloc_param_sizes(abi).into_iter().find(|&(c, _)| c == class).map_or(0, |(_, n)| n)
}

#[cfg(test)]
/// The plan [`capture_plans`] gives `key`, if any.
pub(crate) fn plan_for(abi: &DriverAbi, key: CaptureKey) -> Option<CapturePlan> {
    capture_plans(abi).into_iter().find(|(k, _)| *k == key).map(|(_, p)| p)
}

#[cfg(test)]
mod tests;
