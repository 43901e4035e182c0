//! Per-command decoders for the captured ioctl argument windows.
//!
//! Every decoder first checks what the driver itself checks (`_IOC_SIZE`), then that the window it
//! reads was captured (fault flags) and is long enough for every field it reads, the status
//! included. A failed check yields [`IoctlOp::Malformed`]; field reads past a checked length cannot
//! happen, and the accessors return 0 rather than panic if they ever did.

use tracer_common::{
    IoctlRecord, flags,
    nv::{self, DriverAbi, class, esc, off, size, uvm},
};

use super::{CardInfoEntry, IoctlOp, Location, MalformedReason, MemoryAlloc, MemoryKind, RmAllocForm};

/// Little-endian field reads from a captured window.
#[derive(Clone, Copy)]
pub(crate) struct Window<'a>(pub(crate) &'a [u8]);

impl Window<'_> {
    fn bytes<const N: usize>(&self, off: usize) -> [u8; N] {
        let mut out = [0u8; N];
        if let Some(end) = off.checked_add(N)
            && let Some(s) = self.0.get(off..end)
        {
            out.copy_from_slice(s);
        }
        out
    }
    pub(crate) fn u8(&self, off: usize) -> u8 {
        self.0.get(off).copied().unwrap_or(0)
    }
    pub(crate) fn u16(&self, off: usize) -> u16 {
        u16::from_le_bytes(self.bytes(off))
    }
    pub(crate) fn u32(&self, off: usize) -> u32 {
        u32::from_le_bytes(self.bytes(off))
    }
    pub(crate) fn i32(&self, off: usize) -> i32 {
        i32::from_le_bytes(self.bytes(off))
    }
    pub(crate) fn u64(&self, off: usize) -> u64 {
        u64::from_le_bytes(self.bytes(off))
    }
    pub(crate) fn uuid(&self, off: usize) -> [u8; 16] {
        self.bytes(off)
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

type Decoded = Result<IoctlOp, MalformedReason>;

fn main_window(r: &IoctlRecord) -> Window<'_> {
    Window(&r.main[..(r.main_len as usize).min(r.main.len())])
}

/// Check that the main window was captured and holds `need` bytes.
fn readable(r: &IoctlRecord, need: usize) -> Result<Window<'_>, MalformedReason> {
    if r.hdr.flags & flags::FAULT_MAIN != 0 {
        return Err(MalformedReason::FaultMain);
    }
    let w = main_window(r);
    if w.len() < need {
        return Err(MalformedReason::ShortMain);
    }
    Ok(w)
}

/// An RM escape: the driver requires `_IOC_SIZE == size` exactly (`RmValidateIoctl`).
fn exact(r: &IoctlRecord, size: u32, need: usize) -> Result<Window<'_>, MalformedReason> {
    if r.size != size {
        return Err(MalformedReason::BadSize);
    }
    readable(r, need)
}

/// The nested window, if it was captured.
fn nested_window(r: &IoctlRecord) -> Option<Window<'_>> {
    if r.hdr.flags & flags::FAULT_NESTED != 0 {
        return None;
    }
    Some(Window(&r.nested[..(r.nested_len as usize).min(r.nested.len())]))
}

/// How the nested parameters of a memory class are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MemLayout {
    /// `NV_MEMORY_ALLOCATION_PARAMS`: attr@24, size@64.
    MemParams,
    /// `NV_PHYSICAL_MEMORY_ALLOCATION_PARAMS`: memSize@0.
    Physical,
    /// `NV00F8_ALLOCATION_PARAMETERS`: allocSize@8.
    Fabric,
    /// `NV_OS_DESC_MEMORY_ALLOCATION_PARAMS`: limit@24 (size − 1).
    OsDesc,
    /// `NV_MEMORY_VIRTUAL_ALLOCATION_PARAMS`: offset@0, limit@8.
    Virtual,
}

impl MemLayout {
    /// Bytes of the nested block needed to read the size (and attr).
    pub(crate) fn need(self) -> usize {
        match self {
            MemLayout::MemParams => off::MEM_PARAMS_SIZE + 8,
            MemLayout::Physical => off::PHYS_MEM_SIZE + 8,
            MemLayout::Fabric => off::FABRIC_ALLOC_SIZE + 8,
            MemLayout::OsDesc => off::OSDESC_LIMIT + 8,
            MemLayout::Virtual => off::VIRT_LIMIT + 8,
        }
    }
}

/// For RM_ALLOC classes that create memory: the kind, the nested layout, and the location when the
/// class fixes it (None: read it from `attr`).
pub(crate) fn memory_class(c: u32) -> Option<(MemoryKind, MemLayout, Option<Location>)> {
    Some(match c {
        class::NV01_MEMORY_LOCAL_USER => (MemoryKind::Physical, MemLayout::MemParams, None),
        // System memory classes: the class decides, whatever attr says (0 would read as VIDMEM).
        class::NV01_MEMORY_SYSTEM | class::NV01_MEMORY_DEVICELESS => {
            (MemoryKind::Physical, MemLayout::MemParams, Some(Location::Sysmem))
        }
        class::NV50_MEMORY_VIRTUAL => (MemoryKind::VirtualOnly, MemLayout::MemParams, Some(Location::Unknown)),
        class::NV01_MEMORY_LOCAL_PHYSICAL => (MemoryKind::Physical, MemLayout::Physical, Some(Location::Vidmem)),
        class::NV_MEMORY_FABRIC => (MemoryKind::Fabric, MemLayout::Fabric, Some(Location::Vidmem)),
        class::NV01_MEMORY_SYSTEM_OS_DESCRIPTOR => {
            (MemoryKind::OsDescriptor, MemLayout::OsDesc, Some(Location::Sysmem))
        }
        class::NV01_MEMORY_VIRTUAL => (MemoryKind::VirtualOnly, MemLayout::Virtual, Some(Location::Unknown)),
        _ => return None,
    })
}

fn parse_memory(c: u32, nested: Option<Window<'_>>) -> Option<MemoryAlloc> {
    let (kind, layout, fixed) = memory_class(c)?;
    let w = nested?;
    if w.len() < layout.need() {
        return None;
    }
    let bytes = match layout {
        MemLayout::MemParams => w.u64(off::MEM_PARAMS_SIZE),
        MemLayout::Physical => w.u64(off::PHYS_MEM_SIZE),
        MemLayout::Fabric => w.u64(off::FABRIC_ALLOC_SIZE),
        MemLayout::OsDesc => w.u64(off::OSDESC_LIMIT).wrapping_add(1),
        MemLayout::Virtual => w.u64(off::VIRT_LIMIT).wrapping_sub(w.u64(off::VIRT_OFFSET)).wrapping_add(1),
    };
    let location = fixed.unwrap_or_else(|| Location::from_attr(w.u32(off::MEM_PARAMS_ATTR)));
    Some(MemoryAlloc { bytes, location, kind })
}

/// Decode an ioctl on `/dev/nvidiactl` or `/dev/nvidiaN`.
pub(super) fn frontend(r: &IoctlRecord, abi: &DriverAbi) -> IoctlOp {
    let nr = r.nr;
    if r.hdr.flags & flags::FAULT_XFER != 0 {
        return IoctlOp::Malformed { nr, reason: MalformedReason::FaultXfer };
    }
    let decoded: Decoded = match nr {
        esc::RM_ALLOC => rm_alloc(r, abi),
        esc::RM_ALLOC_OBJECT => rm_alloc_object(r),
        esc::RM_FREE => exact(r, size::NVOS00, off::FREE_STATUS + 4).map(|w| IoctlOp::RmFree {
            client: w.u32(off::FREE_H_ROOT),
            parent: w.u32(off::FREE_H_PARENT),
            handle: w.u32(off::FREE_H_OBJECT),
            status: w.u32(off::FREE_STATUS),
        }),
        esc::RM_VID_HEAP_CONTROL => vid_heap(r),
        esc::RM_ALLOC_MEMORY => alloc_memory(r),
        esc::RM_CONTROL => exact(r, size::NVOS54, off::CTRL_STATUS + 4).map(|w| IoctlOp::RmControl {
            client: w.u32(off::CTRL_H_CLIENT),
            object: w.u32(off::CTRL_H_OBJECT),
            cmd: w.u32(off::CTRL_CMD),
            status: w.u32(off::CTRL_STATUS),
        }),
        esc::RM_DUP_OBJECT => exact(r, size::NVOS55, off::DUP_STATUS + 4).map(|w| IoctlOp::RmDupObject {
            client: w.u32(off::DUP_H_CLIENT),
            parent: w.u32(off::DUP_H_PARENT),
            handle: w.u32(off::DUP_H_OBJECT),
            src_client: w.u32(off::DUP_H_CLIENT_SRC),
            src_handle: w.u32(off::DUP_H_OBJECT_SRC),
            status: w.u32(off::DUP_STATUS),
        }),
        esc::RM_MAP_MEMORY => exact(r, size::NVOS33_WITH_FD, off::MAP_FD + 4).map(|w| IoctlOp::RmMapMemory {
            client: w.u32(off::MAP_H_CLIENT),
            device: w.u32(off::MAP_H_DEVICE),
            memory: w.u32(off::MAP_H_MEMORY),
            offset: w.u64(off::MAP_OFFSET),
            length: w.u64(off::MAP_LENGTH),
            fd: w.i32(off::MAP_FD),
            status: w.u32(off::MAP_STATUS),
        }),
        esc::RM_UNMAP_MEMORY => exact(r, size::NVOS34, off::UNMAP_STATUS + 4).map(|w| IoctlOp::RmUnmapMemory {
            client: w.u32(off::UNMAP_H_CLIENT),
            device: w.u32(off::UNMAP_H_DEVICE),
            memory: w.u32(off::UNMAP_H_MEMORY),
            status: w.u32(off::UNMAP_STATUS),
        }),
        esc::REGISTER_FD => {
            if r.size < size::REGISTER_FD {
                Err(MalformedReason::BadSize)
            } else {
                readable(r, off::REGISTER_FD_CTL_FD + 4)
                    .map(|w| IoctlOp::RegisterFd { ctl_fd: w.i32(off::REGISTER_FD_CTL_FD) })
            }
        }
        esc::CARD_INFO => card_info(r),
        esc::CHECK_VERSION_STR => {
            if r.size < size::RM_API_VERSION {
                Err(MalformedReason::BadSize)
            } else {
                readable(r, size::RM_API_VERSION as usize).map(|w| IoctlOp::CheckVersion {
                    reply: w.u32(off::RM_API_VERSION_REPLY),
                    version: super::c_string(&w.0[off::RM_API_VERSION_STRING..size::RM_API_VERSION as usize]),
                })
            }
        }
        _ => Ok(IoctlOp::OtherFrontend { nr }),
    };
    decoded.unwrap_or_else(|reason| IoctlOp::Malformed { nr, reason })
}

fn rm_alloc(r: &IoctlRecord, abi: &DriverAbi) -> Decoded {
    // The driver accepts exactly these two sizes for RM_ALLOC; anything else is -EINVAL.
    let (form, status_off) = if r.size == size::NVOS21 {
        (RmAllocForm::Nvos21, off::NVOS21_STATUS)
    } else if r.size == abi.nvos64_size {
        (RmAllocForm::Nvos64, abi.nvos64_status)
    } else {
        return Err(MalformedReason::BadSize);
    };
    let w = readable(r, status_off + 4)?;
    let handle = w.u32(off::ALLOC_H_NEW);
    let hclass = w.u32(off::ALLOC_H_CLASS);
    let status = w.u32(status_off);
    // A client's handle is the new object itself (hRoot is 0 on input).
    let client = if class::is_root(hclass) { handle } else { w.u32(off::ALLOC_H_ROOT) };
    let nested = nested_window(r);
    let memory = parse_memory(hclass, nested);
    let succeeded = r.ret == 0 && status == nv::NV_OK;
    if succeeded && memory.is_none() && memory_class(hclass).is_some() {
        // The object exists but its size is unknown: count it as malformed rather than guess.
        return Err(if nested.is_none() { MalformedReason::FaultNested } else { MalformedReason::ShortNested });
    }
    let nested_u32 = |o: usize| nested.filter(|n| n.len() >= o + 4).map(|n| n.u32(o));
    Ok(IoctlOp::RmAlloc {
        client,
        parent: w.u32(off::ALLOC_H_PARENT),
        handle,
        class: hclass,
        status,
        form,
        memory,
        device_instance: if hclass == class::NV01_DEVICE_0 { nested_u32(off::DEVICE_ID) } else { None },
        subdevice_instance: if hclass == class::NV20_SUBDEVICE_0 { nested_u32(off::SUBDEVICE_ID) } else { None },
    })
}

fn rm_alloc_object(r: &IoctlRecord) -> Decoded {
    let w = exact(r, size::NVOS05, off::NVOS05_STATUS + 4)?;
    let handle = w.u32(off::ALLOC_H_NEW);
    let hclass = w.u32(off::ALLOC_H_CLASS);
    Ok(IoctlOp::RmAlloc {
        client: if class::is_root(hclass) { handle } else { w.u32(off::ALLOC_H_ROOT) },
        parent: w.u32(off::ALLOC_H_PARENT),
        handle,
        class: hclass,
        status: w.u32(off::NVOS05_STATUS),
        form: RmAllocForm::Nvos05,
        memory: None,
        device_instance: None,
        subdevice_instance: None,
    })
}

fn vid_heap(r: &IoctlRecord) -> Decoded {
    let w = exact(r, size::NVOS32, off::VHC_STATUS + 4)?;
    let client = w.u32(off::VHC_H_ROOT);
    let parent = w.u32(off::VHC_H_PARENT);
    let status = w.u32(off::VHC_STATUS);
    match w.u32(off::VHC_FUNCTION) {
        nv::NVOS32_FUNCTION_ALLOC_SIZE => {
            let w = readable(r, off::VHC_ALLOC_SIZE + 8)?;
            Ok(IoctlOp::VidHeapAlloc {
                client,
                parent,
                handle: w.u32(off::VHC_H_MEMORY),
                bytes: w.u64(off::VHC_ALLOC_SIZE),
                virtual_only: w.u32(off::VHC_ALLOC_FLAGS) & nv::NVOS32_ALLOC_FLAGS_VIRTUAL != 0,
                location: Location::from_attr(w.u32(off::VHC_ALLOC_ATTR)),
                status,
            })
        }
        nv::NVOS32_FUNCTION_FREE => {
            let w = readable(r, off::VHC_H_MEMORY + 4)?;
            Ok(IoctlOp::VidHeapFree { client, parent, handle: w.u32(off::VHC_H_MEMORY), status })
        }
        function => Ok(IoctlOp::VidHeapOther { client, function, status }),
    }
}

/// NVOS02 `flags` LOCATION (bits 11:8): PCI = 0, VIDMEM = 2.
pub(crate) fn nvos02_location(flags: u32) -> Location {
    match nv::nvos02_location(flags) {
        nv::NVOS02_LOCATION_PCI => Location::Sysmem,
        nv::NVOS02_LOCATION_VIDMEM => Location::Vidmem,
        _ => Location::Unknown,
    }
}

/// The memory kind an NVOS02 allocation of `class` creates.
pub(crate) fn nvos02_kind(c: u32) -> MemoryKind {
    match c {
        class::NV01_MEMORY_SYSTEM_OS_DESCRIPTOR => MemoryKind::OsDescriptor,
        class::NV01_MEMORY_VIRTUAL | class::NV50_MEMORY_VIRTUAL => MemoryKind::VirtualOnly,
        class::NV_MEMORY_FABRIC => MemoryKind::Fabric,
        _ => MemoryKind::Physical,
    }
}

fn alloc_memory(r: &IoctlRecord) -> Decoded {
    let w = exact(r, size::NVOS02_WITH_FD, off::NVOS02_STATUS + 4)?;
    let hclass = w.u32(off::NVOS02_H_CLASS);
    Ok(IoctlOp::AllocMemory {
        client: w.u32(off::NVOS02_H_ROOT),
        parent: w.u32(off::NVOS02_H_PARENT),
        handle: w.u32(off::NVOS02_H_NEW),
        class: hclass,
        memory: MemoryAlloc {
            bytes: w.u64(off::NVOS02_LIMIT).wrapping_add(1),
            location: nvos02_location(w.u32(off::NVOS02_FLAGS)),
            kind: nvos02_kind(hclass),
        },
        status: w.u32(off::NVOS02_STATUS),
    })
}

fn card_info(r: &IoctlRecord) -> Decoded {
    let entry = size::CARD_INFO_ENTRY;
    // The driver wants a whole number of entries.
    if r.size == 0 || !r.size.is_multiple_of(entry) {
        return Err(MalformedReason::BadSize);
    }
    let w = readable(r, entry as usize)?;
    let n = (r.size as usize).min(w.len()) / entry as usize;
    let cards = (0..n)
        .map(|i| {
            let e = Window(&w.0[i * entry as usize..(i + 1) * entry as usize]);
            CardInfoEntry {
                valid: e.u8(off::CARD_INFO_VALID) != 0,
                pci_domain: e.u32(off::CARD_INFO_PCI_DOMAIN),
                pci_bus: e.u8(off::CARD_INFO_PCI_BUS),
                pci_slot: e.u8(off::CARD_INFO_PCI_SLOT),
                pci_function: e.u8(off::CARD_INFO_PCI_FUNCTION),
                vendor_id: e.u16(off::CARD_INFO_PCI_VENDOR_ID),
                device_id: e.u16(off::CARD_INFO_PCI_DEVICE_ID),
                gpu_id: e.u32(off::CARD_INFO_GPU_ID),
                minor: e.u32(off::CARD_INFO_MINOR_NUMBER),
            }
        })
        .collect();
    Ok(IoctlOp::CardInfo { cards })
}

/// Decode an ioctl on `/dev/nvidia-uvm` (`r.nr` is the UVM command).
pub(super) fn uvm(r: &IoctlRecord, abi: &DriverAbi) -> IoctlOp {
    let cmd = r.nr;
    let decoded: Decoded = match cmd {
        uvm::INITIALIZE => readable(r, uvm::INITIALIZE_STATUS + 4)
            .map(|w| IoctlOp::UvmInitialize { flags: w.u64(0), status: w.u32(uvm::INITIALIZE_STATUS) }),
        uvm::MM_INITIALIZE => readable(r, nv::UVM_MM_INITIALIZE_STATUS + 4).map(|w| IoctlOp::UvmMmInitialize {
            uvm_fd: w.i32(nv::UVM_MM_INITIALIZE_FD),
            status: w.u32(nv::UVM_MM_INITIALIZE_STATUS),
        }),
        uvm::REGISTER_GPU => readable(r, uvm::REGISTER_GPU_STATUS + 4).map(|w| IoctlOp::UvmRegisterGpu {
            uuid: w.uuid(uvm::REGISTER_GPU_UUID),
            rm_ctrl_fd: w.i32(uvm::REGISTER_GPU_RM_CTRL_FD),
            client: w.u32(uvm::REGISTER_GPU_H_CLIENT),
            status: w.u32(uvm::REGISTER_GPU_STATUS),
        }),
        uvm::UNREGISTER_GPU => readable(r, uvm::UNREGISTER_GPU_STATUS + 4)
            .map(|w| IoctlOp::UvmUnregisterGpu { uuid: w.uuid(0), status: w.u32(uvm::UNREGISTER_GPU_STATUS) }),
        uvm::CREATE_EXTERNAL_RANGE => {
            readable(r, uvm::CREATE_EXTERNAL_RANGE_STATUS + 4).map(|w| IoctlOp::UvmCreateExternalRange {
                base: w.u64(0),
                length: w.u64(8),
                status: w.u32(uvm::CREATE_EXTERNAL_RANGE_STATUS),
            })
        }
        uvm::MAP_EXTERNAL_ALLOCATION => map_external(r, abi),
        uvm::UNMAP_EXTERNAL => readable(r, nv::UVM_UNMAP_EXTERNAL_STATUS + 4).map(|w| IoctlOp::UvmUnmapExternal {
            base: w.u64(0),
            length: w.u64(8),
            uuid: w.uuid(nv::UVM_UNMAP_EXTERNAL_UUID),
            status: w.u32(nv::UVM_UNMAP_EXTERNAL_STATUS),
        }),
        uvm::FREE => readable(r, abi.uvm_free_status + 4)
            .map(|w| IoctlOp::UvmFree { base: w.u64(0), status: w.u32(abi.uvm_free_status) }),
        uvm::PAGEABLE_MEM_ACCESS => readable(r, nv::UVM_PAGEABLE_MEM_ACCESS_STATUS + 4).map(|w| {
            IoctlOp::UvmPageableMemAccess { enabled: w.u8(0) != 0, status: w.u32(nv::UVM_PAGEABLE_MEM_ACCESS_STATUS) }
        }),
        uvm::VALIDATE_VA_RANGE => {
            readable(r, nv::UVM_VALIDATE_VA_RANGE_STATUS + 4).map(|w| IoctlOp::UvmValidateVaRange {
                base: w.u64(0),
                length: w.u64(8),
                status: w.u32(nv::UVM_VALIDATE_VA_RANGE_STATUS),
            })
        }
        _ => Ok(IoctlOp::UvmOther { cmd }),
    };
    decoded.unwrap_or_else(|reason| IoctlOp::Malformed { nr: cmd, reason })
}

fn map_external(r: &IoctlRecord, abi: &DriverAbi) -> Decoded {
    let w = readable(r, uvm::MAP_EXTERNAL_HEAD as usize)?;
    if r.hdr.flags & flags::FAULT_TAIL != 0 {
        return Err(MalformedReason::FaultTail);
    }
    if r.tail_off != abi.uvm_map_external_tail {
        return Err(MalformedReason::BadTailOffset);
    }
    if (r.tail_len as u32) < uvm::MAP_EXTERNAL_TAIL_LEN {
        return Err(MalformedReason::ShortTail);
    }
    let t = Window(&r.tail[..(r.tail_len as usize).min(r.tail.len())]);
    Ok(IoctlOp::UvmMapExternal {
        base: w.u64(0),
        length: w.u64(8),
        offset: w.u64(16),
        rm_ctrl_fd: t.i32(nv::UVM_MAP_EXTERNAL_TAIL_RM_CTRL_FD),
        client: t.u32(nv::UVM_MAP_EXTERNAL_TAIL_H_CLIENT),
        memory_handle: t.u32(nv::UVM_MAP_EXTERNAL_TAIL_H_MEMORY),
        status: t.u32(nv::UVM_MAP_EXTERNAL_TAIL_STATUS),
    })
}
