use super::*;
use crate::decode::ioctl::memory_class;
use tracer_common::{
    IOCTL_TAIL_MAX,
    nv::{DriverVersion, off},
};

fn versions() -> Vec<DriverAbi> {
    [(530, 41, 3), (535, 43, 2), (535, 261, 3), (545, 23, 6), (550, 54, 15), (580, 65, 6), (590, 44, 1), (595, 45, 4)]
        .into_iter()
        .map(|(a, b, c)| DriverAbi::for_version(DriverVersion::new(a, b, c)))
        .collect()
}

#[test]
fn plans_fit_the_record_windows_and_the_maps() {
    for abi in versions() {
        let plans = capture_plans(&abi);
        let slots = plan_slots(&plans).unwrap_or_else(|e| panic!("{abi:?}: {e}"));
        assert_eq!(slots.len(), plans.len());
        let mut keys: Vec<_> = plans.iter().map(|(k, _)| (k.space, k.cmd)).collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), plans.len(), "duplicate keys");
        for (k, p) in &plans {
            assert!(p.main_len as usize <= IOCTL_MAIN_MAX, "{k:?}");
            assert!(p.tail_len as usize <= IOCTL_TAIL_MAX, "{k:?}");
            assert!(p.nested_len as usize <= IOCTL_NESTED_MAX, "{k:?}");
            if p.nested_ptr_off != NO_NESTED {
                assert!(p.nested_ptr_off + 8 <= p.main_len);
                assert!(p.class_off + 4 <= p.main_len);
            }
        }
        let sizes = alloc_param_sizes(&abi);
        assert_eq!(class_slots(&sizes).unwrap_or_else(|e| panic!("{abi:?}: {e}")).len(), sizes.len());
        assert!(sizes.iter().all(|&(_, n)| n as usize <= IOCTL_NESTED_MAX && n > 0));
    }
}

#[test]
fn rm_alloc_follows_pallocparms_by_class() {
    let abi = DriverAbi::for_version(DriverVersion::new(535, 261, 3));
    let p = plan_for(&abi, CaptureKey { space: SPACE_FRONTEND, cmd: esc::RM_ALLOC }).unwrap();
    assert_eq!((p.main_len, p.nested_ptr_off, p.nested_by_class, p.class_off), (48, 16, 1, 12));
    let old = DriverAbi::for_version(DriverVersion::new(530, 41, 3));
    assert_eq!(plan_for(&old, CaptureKey { space: SPACE_FRONTEND, cmd: esc::RM_ALLOC }).unwrap().main_len, 40);
}

#[test]
fn uvm_map_external_tail_follows_the_version() {
    let key = CaptureKey { space: SPACE_UVM, cmd: uvm::MAP_EXTERNAL_ALLOCATION };
    let pre = plan_for(&DriverAbi::for_version(DriverVersion::new(545, 29, 6)), key).unwrap();
    let post = plan_for(&DriverAbi::for_version(DriverVersion::new(550, 54, 15)), key).unwrap();
    assert_eq!((pre.main_len, pre.tail_off, pre.tail_len), (24, 1184, 16));
    assert_eq!((post.main_len, post.tail_off, post.tail_len), (24, 9248, 16));
    let free = CaptureKey { space: SPACE_UVM, cmd: uvm::FREE };
    assert_eq!(plan_for(&DriverAbi::for_version(DriverVersion::new(580, 65, 6)), free).unwrap().main_len, 24);
    assert_eq!(plan_for(&DriverAbi::for_version(DriverVersion::new(590, 44, 1)), free).unwrap().main_len, 16);
}

#[test]
fn memory_classes_get_their_param_sizes() {
    let new = DriverAbi::for_version(DriverVersion::new(550, 54, 15));
    let old = DriverAbi::for_version(DriverVersion::new(535, 261, 3));
    assert_eq!(alloc_param_size(&new, 0x40), 128);
    assert_eq!(alloc_param_size(&old, 0x40), 120);
    for (c, n) in [(0xc2, 24), (0xf8, 48), (0x71, 40), (0x70, 24), (0x80, 56), (0x2080, 4), (0x3e, 120), (0x90ce, 120)]
    {
        assert_eq!(alloc_param_size(&old, c), n, "class {c:#x}");
    }
    // Every class the decoder reads memory from has a nested size that covers the size field.
    for abi in versions() {
        for (c, n) in alloc_param_sizes(&abi) {
            if let Some((_, layout, _)) = memory_class(c) {
                assert!(n as usize >= layout.need(), "class {c:#x}");
            }
        }
        assert!(alloc_param_size(&abi, class::NV01_DEVICE_0) as usize >= off::DEVICE_ID + 4);
    }
}

#[test]
fn only_the_commands_the_memory_ledger_applies_go_through_the_ledger_ring() {
    // The commands `state::TracerState::ioctl` turns into objects, frees and duplicates; every
    // other command only counts, and its records may be dropped without making a ledger inexact.
    let mut want = vec![
        esc::RM_ALLOC,
        esc::RM_ALLOC_OBJECT,
        esc::RM_FREE,
        esc::RM_DUP_OBJECT,
        esc::RM_VID_HEAP_CONTROL,
        esc::RM_ALLOC_MEMORY,
    ];
    want.sort();
    for abi in versions() {
        let mut got: Vec<u32> = capture_plans(&abi)
            .iter()
            .filter(|(_, p)| p.ledger != 0)
            .map(|(k, _)| {
                assert_eq!(k.space, SPACE_FRONTEND, "no UVM command changes the memory ledger");
                k.cmd
            })
            .collect();
        got.sort();
        assert_eq!(got, want);
    }
}

#[test]
fn slot_tables_refuse_two_commands_in_one_slot() {
    let fe = |cmd| CaptureKey { space: SPACE_FRONTEND, cmd };
    let uv = |cmd| CaptureKey { space: SPACE_UVM, cmd };
    // The same low byte in different spaces is fine; in one space it is refused, naming both.
    assert!(plan_slots(&[(fe(0x2b), main_only(8)), (uv(0x2b), main_only(8))]).is_ok());
    let e = plan_slots(&[(uv(uvm::INITIALIZE), main_only(8)), (uv(1), main_only(8))]).unwrap_err();
    assert!(e.contains("0x30000001") && e.contains("0x1"), "{e}");
    // 0x141 folds to 0x41 ^ 0x01 = 0x40, the slot of 0x40.
    assert!(class_slots(&[(0x40, 8), (0x4040, 8)]).is_ok());
    let e = class_slots(&[(0x40, 8), (0x141, 8)]).unwrap_err();
    assert!(e.contains("0x40") && e.contains("0x141"), "{e}");
}
