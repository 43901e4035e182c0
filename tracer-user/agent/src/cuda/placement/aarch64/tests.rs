use std::collections::HashMap;

use super::*;

/// Where `cargo xtask setup` unpacks Debian's arm64 libcuda (`libcuda1:arm64`, never run here).
pub const REAL_ARM64_LIBCUDA: &str = "/opt/gpu-tracer/arm64/libcuda.so.1";

fn real_arm64_libcuda() -> Vec<u8> {
    std::fs::read(REAL_ARM64_LIBCUDA).unwrap_or_else(|e| {
        panic!(
            "the real arm64 libcuda is required and missing ({REAL_ARM64_LIBCUDA}: {e}); run `cargo xtask setup`, \
             which downloads Debian non-free `libcuda1:arm64` and unpacks it there (every CI machine has it)"
        )
    })
}

fn class(insn: u32) -> Result<InsnClass, String> {
    classify(insn).map(|d| d.class)
}

/// The encodings of each class, from the Arm ARM, against the kernel's lists.
#[test]
fn classifies_like_the_arm64_uprobe_decoder() {
    let sim = [
        (0x9000_0010, "adrp x16, 0"),
        (0x1000_0040, "adr x0, 8"),
        (0x1400_0010, "b"),
        (0x9400_0010, "bl"),
        (0x5400_0040, "b.eq"),
        (0xB400_0040, "cbz x0"),
        (0x3500_0040, "cbnz w0"),
        (0x3600_0040, "tbz"),
        (0xD61F_0200, "br x16"),
        (0xD63F_0200, "blr x16"),
        (0xD65F_03C0, "ret"),
        (0x5800_0040, "ldr x0, =lit"),
        (0x1800_0040, "ldr w0, =lit"),
        (0x9800_0040, "ldrsw x0, =lit"),
    ];
    for (insn, what) in sim {
        assert_eq!(class(insn), Ok(InsnClass::Emulated), "{what}");
    }
    let stepped = [
        (0xA9BE_4FF3, "stp x19, x19, [sp, #-32]!"),
        (0xA9BF_7BFD, "stp x29, x30, [sp, #-16]!"),
        (0xD100_43FF, "sub sp, sp, #16"),
        (0x5280_0080, "mov w0, #4"),
        (0xF940_0108, "ldr x8, [x8]"),
        (0xAA08_03F0, "mov x16, x8"),
        (0x6B08_013F, "cmp w9, w8"),
        (0xD503_201F, "nop"),
        (0xD503_245F, "bti c"),
        (0xD503_233F, "paciasp"),
        (0xD503_237F, "pacibsp"),
        (0xD503_3BBF, "dmb ish"),
        (0xF8E0_0020, "ldaddal (LSE atomic)"),
    ];
    for (insn, what) in stepped {
        assert_eq!(class(insn), Ok(InsnClass::SingleStepped), "{what}");
    }
    let rejected = [
        (0xC85F_7C20, "ldxr x0, [x1]"),
        (0xC800_7C20, "stxr w0, x0, [x1]"),
        (0xC8DF_FC20, "ldar x0, [x1]"),
        (0xC89F_FC20, "stlr x0, [x1]"),
        (0xC8A0_7C41, "cas x0, x1, [x2]"),
        (0xD800_0040, "prfm (literal)"),
        (0x5C00_0040, "ldr d0, =lit"),
        (0xD400_0001, "svc #0"),
        (0xD420_0000, "brk #0"),
        (0xD53B_D040, "mrs x0, tpidr_el0"),
        (0xD51B_D040, "msr tpidr_el0, x0"),
        (0xD503_23BF, "autiasp"),
        (0xD503_203F, "yield"),
        (0xD65F_0BFF, "retaa"),
        (0xD71F_0A1F, "braaz x16"),
        (0xD69F_03E0, "eret"),
    ];
    for (insn, what) in rejected {
        assert!(class(insn).is_err(), "{what}: {:?}", class(insn));
    }
}

/// Where the probe goes in the prologues arm64 compilers emit: past `bti c` and (entry only)
/// `paciasp` to a simulated instruction; a return probe never past `paciasp`; nothing skipped to
/// reach a single-stepped one; an unsafe first instruction refused.
#[test]
fn landing_pads_and_signatures_are_skipped_only_where_safe() {
    const BTI_C: u32 = 0xD503_245F;
    const PACIASP: u32 = 0xD503_233F;
    const ADRP: u32 = 0x9000_0010;
    const STP: u32 = 0xA9BF_7BFD;
    let at = |w: &[u32], ret: bool| choose_point(w, ret).map(|(i, d, s)| (i, d.class, s.len()));
    assert_eq!(at(&[ADRP, STP], false), Ok((0, InsnClass::Emulated, 0)));
    assert_eq!(at(&[BTI_C, ADRP, STP], false), Ok((1, InsnClass::Emulated, 1)));
    assert_eq!(at(&[BTI_C, ADRP, STP], true), Ok((1, InsnClass::Emulated, 1)), "bti does not touch x30");
    assert_eq!(at(&[PACIASP, ADRP, STP], false), Ok((1, InsnClass::Emulated, 1)));
    assert_eq!(at(&[PACIASP, ADRP, STP], true), Ok((0, InsnClass::SingleStepped, 0)), "before x30 is signed");
    assert_eq!(at(&[BTI_C, PACIASP, ADRP], false), Ok((2, InsnClass::Emulated, 2)));
    assert_eq!(at(&[BTI_C, PACIASP, ADRP], true), Ok((0, InsnClass::SingleStepped, 0)));
    assert_eq!(at(&[BTI_C, STP, ADRP], false), Ok((0, InsnClass::SingleStepped, 0)), "never past real work");
    assert_eq!(at(&[BTI_C, PACIASP, STP], false), Ok((0, InsnClass::SingleStepped, 0)));
    assert_eq!(at(&[BTI_C], false), Ok((0, InsnClass::SingleStepped, 0)));
    assert!(at(&[0xC85F_7C20, ADRP], false).is_err(), "ldxr first: refused");
    assert!(at(&[0xD503_23BF, ADRP], false).is_err(), "autiasp first: refused");
}

/// Every entry point the cuda family probes, on the real arm64 libcuda 535: placed at the symbol,
/// on the thunk's simulated `adrp`, for entry and return probes alike.
#[test]
fn real_arm64_libcuda_entry_points_are_probed_on_a_simulated_adrp() {
    let bytes = real_arm64_libcuda();
    let placer = Placer::new(&bytes).unwrap();
    let mut placed = 0;
    for (_, symbol, action) in tracer_common::cuda_entry::ALL {
        let p = match placer.place(symbol) {
            Err(e) if e.is_missing_symbol() => continue,
            r => r.unwrap_or_else(|e| panic!("{symbol}: {e}")),
        };
        assert_eq!(p.kind, PlacementKind::AtSymbol, "{symbol}: {}", p.reason);
        assert_eq!((p.first_insn.as_str(), p.first_insn_class), ("adrp", InsnClass::Emulated), "{symbol}");
        assert_eq!(p.stack_delta, 0);
        if matches!(
            action,
            tracer_common::cuda_entry::Action::Alloc
                | tracer_common::cuda_entry::Action::AllocPitch
                | tracer_common::cuda_entry::Action::Lookup
        ) {
            let r = placer.place_for_return(symbol).unwrap();
            assert_eq!(r.probe_addr, p.symbol_addr, "{symbol}: a return probe at the symbol");
        }
        placed += 1;
    }
    // As many as on the x86 libcuda of the same version (25 of the cuda family's entry points).
    assert!(placed >= 25, "{placed} entry points placed");
    // The recipe's numbers (platform-recipes.md): cuLaunchKernel's thunk at 0x2d4af0.
    assert_eq!(placer.place("cuLaunchKernel").unwrap().symbol_addr, 0x2d4af0);
}

/// The whole export table of the arm64 libcuda: every function gets a point the kernel accepts,
/// and the counts per first instruction are printed (`--nocapture`).
#[test]
fn real_arm64_libcuda_every_export_gets_a_safe_point() {
    use object::{Object, ObjectSymbol};
    let bytes = real_arm64_libcuda();
    let placer = Placer::new(&bytes).unwrap();
    let file = object::File::parse(&*bytes).unwrap();
    let names: Vec<String> = file
        .dynamic_symbols()
        .filter(|s| s.kind() == object::SymbolKind::Text && s.is_definition())
        .filter_map(|s| s.name().ok().map(str::to_string))
        .collect();
    assert!(names.len() > 500, "{} exported functions", names.len());
    let mut by_insn: HashMap<(PlacementKind, String), usize> = HashMap::new();
    for n in &names {
        let p = placer.place(n).unwrap_or_else(|e| panic!("{n}: {e}"));
        assert!(classify(placer.word_at(p.probe_addr).unwrap()).is_ok(), "{n}");
        *by_insn.entry((p.kind, p.first_insn)).or_default() += 1;
    }
    let mut rows: Vec<_> = by_insn.into_iter().collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.1));
    println!("{} exported functions in {REAL_ARM64_LIBCUDA}:", names.len());
    for ((kind, insn), n) in &rows {
        println!("  {n:4}  {:<18} `{insn}`", kind.as_str());
    }
    let adrp: usize = rows.iter().filter(|((_, i), _)| i == "adrp").map(|(_, n)| n).sum();
    assert!(adrp >= 566, "the recipe counted at least 566 thunks starting with adrp; {adrp}");
}
