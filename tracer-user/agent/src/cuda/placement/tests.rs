//! Tests of `cuda::placement`: the real libcuda (installed by `cargo xtask setup`), tiny shared
//! objects built with gcc from C and assembly, and arbitrary bytes.
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use iced_x86::{Decoder, DecoderOptions, Mnemonic, OpKind};
use object::{Object, ObjectSection, ObjectSymbol, RelocationFlags, elf};
use proptest::prelude::*;

use super::*;

const REAL_LIBCUDA: &str = "/usr/lib/x86_64-linux-gnu/libcuda.so.1";

/// The entry points the brief names; every one must be a 535-style thunk.
const REAL_SYMBOLS: &[&str] =
    &["cuLaunchKernel", "cuMemAlloc_v2", "cuMemFree_v2", "cuGraphLaunch", "cuLaunchKernel_ptsz", "cuMemAllocAsync"];

fn real_libcuda() -> Vec<u8> {
    std::fs::read(REAL_LIBCUDA).unwrap_or_else(|e| {
        panic!(
            "the real libcuda is required and missing ({REAL_LIBCUDA}: {e}); run `cargo xtask \
             setup`, which installs Debian non-free `libcuda1` (it is installed on every CI \
             machine)"
        )
    })
}

/// aya's translation (`vaddr - sh_addr + sh_offset` of the containing section).
fn aya_offset(bytes: &[u8], vaddr: u64) -> u64 {
    let file = object::File::parse(bytes).unwrap();
    for s in file.sections() {
        if vaddr >= s.address() && vaddr < s.address() + s.size() {
            let (off, _) = s.file_range().expect("section has file content");
            return vaddr - s.address() + off;
        }
    }
    panic!("{vaddr:#x} is in no section");
}

/// All dynamic relocations, as (slot, r_type, addend): an independent reading of `.rela.dyn`.
fn dyn_relocs(bytes: &[u8]) -> HashMap<u64, (u32, i64)> {
    let file = object::File::parse(bytes).unwrap();
    file.dynamic_relocations()
        .expect("dynamic relocations")
        .filter_map(|(off, r)| match r.flags() {
            RelocationFlags::Elf { r_type } => Some((off, (r_type, r.addend()))),
            _ => None,
        })
        .collect()
}

#[test]
fn real_libcuda_entry_points_are_thunks_to_push_rbp() {
    let bytes = real_libcuda();
    let placer = Placer::new(&bytes).expect("libcuda parses");
    let relocs = dyn_relocs(&bytes);
    let mut targets: HashMap<u64, &str> = HashMap::new();
    for &sym in REAL_SYMBOLS {
        let p = placer.place(sym).unwrap_or_else(|e| panic!("{sym}: {e}"));
        println!("{}", describe(&p));
        println!("    reason: {}", p.reason);
        assert_eq!(p.kind, PlacementKind::ThunkTarget, "{sym}: {}", p.reason);
        assert_eq!(p.thunk.len(), 1, "{sym}: one thunk hop");
        let hop = &p.thunk[0];
        assert_eq!(hop.thunk_addr, p.symbol_addr);
        assert_eq!(hop.relocation, "R_X86_64_RELATIVE", "{sym}");
        assert_eq!(hop.target, p.probe_addr);
        // The slot's relocation, read independently: RELATIVE with the target as addend.
        let (r_type, addend) = relocs[&hop.slot_addr];
        assert_eq!(r_type, elf::R_X86_64_RELATIVE);
        assert_eq!(addend as u64, p.probe_addr);
        assert_eq!(p.first_insn, "push rbp", "{sym}");
        assert_eq!(p.first_insn_class, InsnClass::Emulated);
        assert_eq!(p.stack_delta, 0);
        assert!(p.skipped.is_empty());
        assert_ne!(p.probe_addr, p.symbol_addr);
        // The offset aya wants, and the byte there is `push %rbp`.
        assert_eq!(p.file_offset, aya_offset(&bytes, p.probe_addr));
        assert_eq!(bytes[p.file_offset as usize], 0x55);
        // The thunk itself starts with a rip-relative cmp (single-stepped) and has jmp [rip].
        let sym_off = aya_offset(&bytes, p.symbol_addr) as usize;
        let mut dec = Decoder::with_ip(64, &bytes[sym_off..sym_off + 32], p.symbol_addr, DecoderOptions::NONE);
        let cmp = dec.decode();
        assert_eq!(cmp.mnemonic(), Mnemonic::Cmp);
        assert!(cmp.is_ip_rel_memory_operand());
        assert_eq!(placer.classify(&cmp), InsnClass::SingleStepped);
        assert!(dec.decode().is_jcc_short_or_near());
        let jmp = dec.decode();
        assert_eq!(jmp.mnemonic(), Mnemonic::Jmp);
        assert_eq!(jmp.ip_rel_memory_address(), hop.slot_addr);
        // Same point for a uretprobe: [rsp] is still the caller's return address.
        assert_eq!(placer.place_for_return(sym).unwrap(), p);
        if let Some(other) = targets.insert(p.probe_addr, sym) {
            panic!("{sym} and {other} share the implementation {:#x}", p.probe_addr);
        }
    }
}

/// The whole export table: every function is placed without error, and the summary is printed
/// (run with `--nocapture` to read it).
#[test]
fn real_libcuda_all_exported_functions() {
    let bytes = real_libcuda();
    let placer = Placer::new(&bytes).unwrap();
    let file = object::File::parse(&*bytes).unwrap();
    let names: Vec<String> = file
        .dynamic_symbols()
        .filter(|s| s.kind() == object::SymbolKind::Text && s.is_definition())
        .filter_map(|s| s.name().ok().map(str::to_string))
        .collect();
    assert!(names.len() > 300, "{} exported functions", names.len());
    let mut by_kind: HashMap<(PlacementKind, String), usize> = HashMap::new();
    let mut probe_points: HashMap<u64, Vec<String>> = HashMap::new();
    for n in &names {
        let p = placer.place(n).unwrap_or_else(|e| panic!("{n}: {e}"));
        if p.kind != PlacementKind::ThunkTarget {
            println!("  {}\n      {}", describe(&p), p.reason);
        }
        // Every thunk is followed, to an emulated first instruction.
        if placer.match_thunk(p.symbol_addr).is_some() {
            assert_eq!(p.kind, PlacementKind::ThunkTarget, "{n}: {}", p.reason);
            assert_eq!(p.first_insn_class, InsnClass::Emulated, "{n}: {}", p.reason);
        }
        *by_kind.entry((p.kind, p.first_insn.clone())).or_default() += 1;
        probe_points.entry(p.probe_addr).or_default().push(n.clone());
    }
    let mut rows: Vec<_> = by_kind.into_iter().collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.1));
    println!("{} exported functions in {REAL_LIBCUDA}:", names.len());
    for ((kind, insn), n) in &rows {
        println!("  {n:4}  {:<22} `{insn}`", kind.as_str());
    }
    let shared: Vec<_> = probe_points.values().filter(|v| v.len() > 1).collect();
    println!("probe points shared by several symbols: {}", shared.len());
    for v in shared.iter().take(10) {
        println!("  {}", v.join(", "));
    }
    // The launch and allocation families never share a probe point with another symbol.
    for &sym in REAL_SYMBOLS {
        let p = placer.place(sym).unwrap();
        assert_eq!(probe_points[&p.probe_addr], vec![sym.to_string()], "{sym}");
    }
}

/// Informational: how many direct calls/jumps inside libcuda reach each implementation, i.e.
/// calls a probe on the implementation sees and one on the exported thunk would not.
#[test]
fn real_libcuda_direct_references_to_implementations() {
    let bytes = real_libcuda();
    let placer = Placer::new(&bytes).unwrap();
    let file = object::File::parse(&*bytes).unwrap();
    let text = file.section_by_name(".text").expect(".text");
    let wanted: HashMap<u64, &str> = REAL_SYMBOLS.iter().map(|s| (placer.place(s).unwrap().probe_addr, *s)).collect();
    let data = text.data().unwrap();
    let mut dec = Decoder::with_ip(64, data, text.address(), DecoderOptions::NONE);
    let slots: HashMap<u64, &str> =
        REAL_SYMBOLS.iter().map(|s| (placer.place(s).unwrap().thunk[0].slot_addr, *s)).collect();
    let mut hits: HashMap<&str, usize> = HashMap::new();
    let mut slot_refs: HashMap<&str, usize> = HashMap::new();
    let mut insn = Instruction::default();
    while dec.can_decode() {
        dec.decode_out(&mut insn);
        if insn.op0_kind() == OpKind::NearBranch64
            && let Some(s) = wanted.get(&insn.near_branch_target())
        {
            *hits.entry(s).or_default() += 1;
        }
        if insn.is_ip_rel_memory_operand()
            && let Some(s) = slots.get(&insn.ip_rel_memory_address())
        {
            *slot_refs.entry(s).or_default() += 1;
        }
    }
    for s in REAL_SYMBOLS {
        println!(
            "{s}: {} direct branches to the implementation, {} rip-relative uses of its slot \
             (the thunk's own jmp is one)",
            hits.get(s).unwrap_or(&0),
            slot_refs.get(s).unwrap_or(&0)
        );
        assert!(slot_refs.get(s).copied().unwrap_or(0) >= 1, "{s}: the thunk reads its slot");
    }
}

/// Ground truth from the dynamic loader: load the real libcuda in a child process (a C helper
/// built with gcc), read each slot the thunks jump through, before and after `cuInit` (which
/// fails without a GPU), and compare with the target computed from the file.
#[test]
fn real_libcuda_slots_hold_the_computed_targets_once_loaded() {
    let bytes = real_libcuda();
    let placer = Placer::new(&bytes).unwrap();
    const HELPER: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 2; }
    struct link_map *lm;
    if (dlinfo(h, RTLD_DI_LINKMAP, &lm) != 0) return 3;
    uintptr_t base = lm->l_addr;
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
    uint64_t before[64];
    int n = argc - 2 < 64 ? argc - 2 : 64;
    for (int i = 0; i < n; i++)
        before[i] = *(uint64_t *)(base + strtoull(argv[i + 2], 0, 16)) - base;
    int rc = init ? init(0) : -1;
    for (int i = 0; i < n; i++) {
        uint64_t after = *(uint64_t *)(base + strtoull(argv[i + 2], 0, 16)) - base;
        printf("%s %llx %llx %d\n", argv[i + 2], (unsigned long long)before[i],
               (unsigned long long)after, rc);
    }
    return 0;
}
"#;
    let dir = scratch_dir("slots");
    let src = dir.join("slots.c");
    let exe = dir.join("slots");
    std::fs::write(&src, HELPER).unwrap();
    let out = Command::new("gcc").arg("-o").arg(&exe).arg(&src).arg("-ldl").output().unwrap();
    assert!(out.status.success(), "gcc: {}", String::from_utf8_lossy(&out.stderr));
    let placements: Vec<ProbePlacement> = REAL_SYMBOLS.iter().map(|s| placer.place(s).unwrap()).collect();
    let out = Command::new(&exe)
        .arg(REAL_LIBCUDA)
        .args(placements.iter().map(|p| format!("{:x}", p.thunk[0].slot_addr)))
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "helper: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), placements.len(), "{text}");
    for (p, line) in placements.iter().zip(lines) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let before = u64::from_str_radix(f[1], 16).unwrap();
        let after = u64::from_str_radix(f[2], 16).unwrap();
        println!(
            "{}: slot {:#x} holds base+{before:#x} after load, base+{after:#x} after cuInit \
             (returned {}); computed {:#x}",
            p.symbol, p.thunk[0].slot_addr, f[3], p.probe_addr
        );
        assert_eq!(before, p.probe_addr, "{}", p.symbol);
        assert_eq!(after, p.probe_addr, "{}", p.symbol);
    }
}

// ---- Synthetic shared objects ------------------------------------------------------------------

fn scratch_dir(tag: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let d = std::env::temp_dir().join(format!(
        "gpu-tracer-placement-{}-{}-{tag}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Build a shared object with gcc from one source file (`ext` is `c` or `S`).
fn build_so(tag: &str, ext: &str, src: &str, flags: &[&str]) -> Vec<u8> {
    let dir = scratch_dir(tag);
    let src_path = dir.join(format!("{tag}.{ext}"));
    let so = dir.join(format!("lib{tag}.so"));
    std::fs::write(&src_path, src).unwrap();
    let out = Command::new("gcc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(&src_path)
        .args(flags)
        .output()
        .expect("gcc runs (it is on every machine)");
    assert!(out.status.success(), "gcc failed: {}", String::from_utf8_lossy(&out.stderr));
    let bytes = std::fs::read(&so).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    bytes
}

const PLAIN_C: &str = "int plain_fn(int a, int b) { return a * b + 7; }\n";

#[test]
fn plain_function_is_probed_at_its_push() {
    let so = build_so("plain", "c", PLAIN_C, &["-O0", "-fno-omit-frame-pointer", "-fcf-protection=none"]);
    let p = place(&so, "plain_fn").unwrap();
    println!("{}", describe(&p));
    assert_eq!(p.kind, PlacementKind::AtSymbol);
    assert_eq!(p.probe_addr, p.symbol_addr);
    assert_eq!(p.first_insn, "push rbp");
    assert_eq!(p.first_insn_class, InsnClass::Emulated);
    assert_eq!(p.stack_delta, 0);
    assert_eq!(p.file_offset, aya_offset(&so, p.probe_addr));
    assert_eq!(so[p.file_offset as usize], 0x55);
}

#[test]
fn cf_protection_function_is_probed_after_endbr64() {
    let so = build_so("endbr", "c", PLAIN_C, &["-O0", "-fno-omit-frame-pointer", "-fcf-protection=full"]);
    let p = place(&so, "plain_fn").unwrap();
    println!("{}\n    {}", describe(&p), p.reason);
    assert_eq!(p.kind, PlacementKind::AfterEndbr);
    assert_eq!(p.probe_addr, p.symbol_addr + 4, "endbr64 is 4 bytes");
    assert_eq!(p.skipped, vec!["endbr64".to_string()]);
    assert_eq!(p.first_insn, "push rbp");
    assert_eq!(p.first_insn_class, InsnClass::Emulated);
    assert_eq!(p.stack_delta, 0);
    assert_eq!(p.file_offset, aya_offset(&so, p.probe_addr));
    assert_eq!(place_for_return(&so, "plain_fn").unwrap(), p);
}

/// Functions and data written in assembly, so that each prologue is exactly what is tested.
const ASM: &str = r#"
    .text

    .globl riprel_arg
    .type riprel_arg, @function
riprel_arg:                        # loads an argument register: must not be skipped
    movq gvar(%rip), %rdi
    pushq %rbp
    popq %rbp
    ret
    .size riprel_arg, .-riprel_arg

    .globl riprel_rax
    .type riprel_rax, @function
riprel_rax:                        # loads rax only: safe to skip
    movq gvar(%rip), %rax
    pushq %rbp
    popq %rbp
    ret
    .size riprel_rax, .-riprel_rax

    .globl riprel_cmp
    .type riprel_cmp, @function
riprel_cmp:                        # endbr64, then a flags-only rip-relative compare: both skipped
    endbr64
    cmpl $0, gvar(%rip)
    pushq %r12
    popq %r12
    ret
    .size riprel_cmp, .-riprel_cmp

    .globl riprel_loop
    .type riprel_loop, @function
riprel_loop:                       # a loop jumps back to the push: skipping would double-fire
    movq gvar(%rip), %rax
1:  pushq %rbp
    popq %rbp
    decq %rax
    jnz 1b
    ret
    .size riprel_loop, .-riprel_loop

    .globl riprel_store
    .type riprel_store, @function
riprel_store:                      # writes memory: not skipped
    movq %rax, gvar(%rip)
    pushq %rbp
    popq %rbp
    ret
    .size riprel_store, .-riprel_store

    .globl sub_first
    .type sub_first, @function
sub_first:                         # changes rsp: unknown cost, not skipped
    subq $8, %rsp
    pushq %rbp
    popq %rbp
    addq $8, %rsp
    ret
    .size sub_first, .-sub_first

    .globl endbr_sub
    .type endbr_sub, @function
endbr_sub:                         # endbr64 then sub rsp: after endbr, unknown cost
    endbr64
    subq $24, %rsp
    addq $24, %rsp
    ret
    .size endbr_sub, .-endbr_sub

    # --- thunks like libcuda 535's ------------------------------------------------------------
    .globl thunk_rel
    .type thunk_rel, @function
thunk_rel:                         # slot -> local function: R_X86_64_RELATIVE
    cmpl $0x321cba00, flag(%rip)
    je 1f
    jmp *slot_rel(%rip)
    nopw 0x0(%rax,%rax,1)
1:  movl $4, %eax
    ret
    .size thunk_rel, .-thunk_rel

    .globl thunk_abs
    .type thunk_abs, @function
thunk_abs:                         # slot -> exported function: R_X86_64_64 against a symbol
    cmpl $0x321cba00, flag(%rip)
    je 1f
    jmp *slot_abs(%rip)
1:  movl $4, %eax
    ret
    .size thunk_abs, .-thunk_abs

    .globl thunk_endbr
    .type thunk_endbr, @function
thunk_endbr:                       # CET build: endbr64 in the thunk and in the target
    endbr64
    cmpl $0x321cba00, flag(%rip)
    je 1f
    jmp *slot_endbr(%rip)
1:  movl $4, %eax
    ret
    .size thunk_endbr, .-thunk_endbr

    .globl thunk_movzx
    .type thunk_movzx, @function
thunk_movzx:                       # like 535's cuMemsetD8: narrows an argument before the jump
    cmpl $0x321cba00, flag(%rip)
    je 1f
    movzbl %sil, %esi
    jmp *slot_rel(%rip)
1:  movl $4, %eax
    ret
    .size thunk_movzx, .-thunk_movzx

    .globl thunk_shuffle
    .type thunk_shuffle, @function
thunk_shuffle:                     # moves one argument into another: not a transparent thunk
    cmpl $0x321cba00, flag(%rip)
    je 1f
    movq %rsi, %rdi
    jmp *slot_rel(%rip)
1:  movl $4, %eax
    ret
    .size thunk_shuffle, .-thunk_shuffle

    .globl thunk_bare
    .type thunk_bare, @function
thunk_bare:                        # PLT-like: only the indirect jump
    jmp *slot_rel(%rip)
    .size thunk_bare, .-thunk_bare

    .globl thunk_norel
    .type thunk_norel, @function
thunk_norel:                       # slot without relocation: filled at run time
    cmpl $0x321cba00, flag(%rip)
    je 1f
    jmp *slot_norel(%rip)
1:  movl $4, %eax
    ret
    .size thunk_norel, .-thunk_norel

    .globl thunk_import
    .type thunk_import, @function
thunk_import:                      # slot -> a function of another object
    cmpl $0x321cba00, flag(%rip)
    je 1f
    jmp *slot_import(%rip)
1:  movl $4, %eax
    ret
    .size thunk_import, .-thunk_import

    .globl thunk_to_sstep
    .type thunk_to_sstep, @function
thunk_to_sstep:                    # the target starts single-stepped too: probe the symbol
    cmpl $0x321cba00, flag(%rip)
    je 1f
    jmp *slot_sstep(%rip)
1:  movl $4, %eax
    ret
    .size thunk_to_sstep, .-thunk_to_sstep

    .type impl_rel, @function
impl_rel:
    pushq %rbp
    movq %rsp, %rbp
    popq %rbp
    ret
    .size impl_rel, .-impl_rel

    .globl impl_global
    .type impl_global, @function
impl_global:
    pushq %rbp
    movq %rsp, %rbp
    popq %rbp
    ret
    .size impl_global, .-impl_global

    .type impl_endbr, @function
impl_endbr:
    endbr64
    pushq %rbp
    movq %rsp, %rbp
    popq %rbp
    ret
    .size impl_endbr, .-impl_endbr

    .type impl_sstep, @function
impl_sstep:
    movq gvar(%rip), %rdi
    ret
    .size impl_sstep, .-impl_sstep

    .globl hidden_fn
    .hidden hidden_fn
    .type hidden_fn, @function
hidden_fn:
    ret
    .size hidden_fn, .-hidden_fn

    .globl ifunc_fn
    .type ifunc_fn, @gnu_indirect_function
ifunc_fn:
    leaq impl_rel(%rip), %rax
    ret
    .size ifunc_fn, .-ifunc_fn

    .data
    .balign 8
slot_rel:    .quad impl_rel
slot_abs:    .quad impl_global
slot_endbr:  .quad impl_endbr
slot_norel:  .quad 0
slot_import: .quad puts
slot_sstep:  .quad impl_sstep
flag:        .long 0
    .balign 8
    .globl gobj
    .type gobj, @object
gobj:        .quad 0
    .size gobj, 8
gvar:        .quad 5
    .section .note.GNU-stack,"",@progbits
"#;

fn asm_so() -> &'static [u8] {
    static SO: OnceLock<Vec<u8>> = OnceLock::new();
    SO.get_or_init(|| build_so("asm", "S", ASM, &[]))
}

fn placed(sym: &str) -> ProbePlacement {
    let p = place(asm_so(), sym).unwrap_or_else(|e| panic!("{sym}: {e}"));
    println!("{}\n    {}", describe(&p), p.reason);
    assert_eq!(p.file_offset, aya_offset(asm_so(), p.probe_addr), "{sym}");
    p
}

#[test]
fn riprel_load_into_argument_register_stays_at_symbol() {
    let p = placed("riprel_arg");
    assert_eq!(p.kind, PlacementKind::AtSymbol);
    assert_eq!(p.first_insn_class, InsnClass::SingleStepped);
    assert!(p.first_insn.starts_with("mov rdi, qword ptr ["), "{}", p.first_insn);
    assert!(p.reason.contains("writes argument register rdi"), "{}", p.reason);
}

#[test]
fn riprel_load_into_rax_is_skipped() {
    let p = placed("riprel_rax");
    assert_eq!(p.kind, PlacementKind::AfterPrologueSkip);
    assert_eq!(p.first_insn, "push rbp");
    assert_eq!(p.first_insn_class, InsnClass::Emulated);
    assert_eq!(p.skipped.len(), 1);
    assert_eq!(p.probe_addr, p.symbol_addr + 7);
    assert_eq!(p.stack_delta, 0);
}

#[test]
fn endbr_and_flags_only_compare_are_skipped() {
    let p = placed("riprel_cmp");
    assert_eq!(p.kind, PlacementKind::AfterPrologueSkip);
    assert_eq!(p.skipped.len(), 2);
    assert_eq!(p.skipped[0], "endbr64");
    assert_eq!(p.first_insn, "push r12");
    assert_eq!(p.first_insn_class, InsnClass::Emulated);
}

#[test]
fn branch_back_into_skipped_range_keeps_symbol() {
    let p = placed("riprel_loop");
    assert_eq!(p.kind, PlacementKind::AtSymbol);
    assert_eq!(p.first_insn_class, InsnClass::SingleStepped);
    assert!(p.reason.contains("lands in the skipped range"), "{}", p.reason);
}

#[test]
fn memory_store_is_not_skipped() {
    let p = placed("riprel_store");
    assert_eq!(p.kind, PlacementKind::AtSymbol);
    assert_eq!(p.first_insn_class, InsnClass::SingleStepped);
    assert!(p.reason.contains("writes memory"), "{}", p.reason);
}

#[test]
fn stack_adjustment_is_not_skipped() {
    let p = placed("sub_first");
    assert_eq!(p.kind, PlacementKind::AtSymbol);
    assert_eq!(p.first_insn, "sub rsp, 8");
    assert_eq!(p.first_insn_class, InsnClass::Unknown);
    assert!(p.reason.contains("changes rsp"), "{}", p.reason);
    let p = placed("endbr_sub");
    assert_eq!(p.kind, PlacementKind::AfterEndbr);
    assert_eq!(p.first_insn, "sub rsp, 0x18");
    assert_eq!(p.first_insn_class, InsnClass::Unknown);
}

#[test]
fn thunk_through_relative_slot_reaches_push() {
    let p = placed("thunk_rel");
    assert_eq!(p.kind, PlacementKind::ThunkTarget);
    assert_eq!(p.thunk.len(), 1);
    assert_eq!(p.thunk[0].relocation, "R_X86_64_RELATIVE");
    assert_eq!(p.first_insn, "push rbp");
    assert_eq!(p.first_insn_class, InsnClass::Emulated);
    assert_eq!(p.stack_delta, 0);
    let relocs = dyn_relocs(asm_so());
    assert_eq!(relocs[&p.thunk[0].slot_addr], (elf::R_X86_64_RELATIVE, p.probe_addr as i64));
    assert_eq!(place_for_return(asm_so(), "thunk_rel").unwrap(), p);
}

#[test]
fn thunk_through_symbol_slot_reaches_the_exported_target() {
    let p = placed("thunk_abs");
    assert_eq!(p.kind, PlacementKind::ThunkTarget);
    assert!(p.thunk[0].relocation.starts_with("R_X86_64_64 impl_global"), "{}", p.thunk[0].relocation);
    let target = place(asm_so(), "impl_global").unwrap();
    assert_eq!(p.probe_addr, target.symbol_addr);
    assert_eq!(p.first_insn, "push rbp");
}

#[test]
fn thunk_that_only_extends_an_argument_is_followed() {
    let p = placed("thunk_movzx");
    assert_eq!(p.kind, PlacementKind::ThunkTarget);
    assert_eq!(p.first_insn, "push rbp");
    assert!(p.reason.contains("movzx esi, sil"), "{}", p.reason);
    let bare = placed("thunk_bare");
    assert_eq!(bare.kind, PlacementKind::ThunkTarget);
    assert_eq!(bare.probe_addr, p.probe_addr);
}

#[test]
fn thunk_that_moves_arguments_is_not_followed() {
    let p = placed("thunk_shuffle");
    assert_eq!(p.kind, PlacementKind::AtSymbol);
    assert_eq!(p.first_insn_class, InsnClass::SingleStepped);
}

#[test]
fn cet_thunk_and_target_are_followed_and_endbr_skipped() {
    let p = placed("thunk_endbr");
    assert_eq!(p.kind, PlacementKind::ThunkTargetAfterEndbr);
    assert_eq!(p.probe_addr, p.thunk[0].target + 4);
    assert_eq!(p.first_insn, "push rbp");
    assert_eq!(p.first_insn_class, InsnClass::Emulated);
    assert_eq!(p.stack_delta, 0);
}

#[test]
fn unresolvable_thunks_fall_back_to_the_symbol_with_a_reason() {
    for (sym, why) in [
        ("thunk_norel", "no dynamic relocation"),
        ("thunk_import", "another object defines"),
        ("thunk_to_sstep", "single-stepped as well"),
    ] {
        let p = placed(sym);
        assert_eq!(p.kind, PlacementKind::AtSymbol, "{sym}");
        assert_eq!(p.probe_addr, p.symbol_addr);
        assert!(p.thunk.is_empty());
        assert!(p.first_insn.starts_with("cmp dword ptr ["), "{sym}: {}", p.first_insn);
        assert_eq!(p.first_insn_class, InsnClass::SingleStepped);
        assert!(p.reason.contains(why), "{sym}: {}", p.reason);
    }
}

#[test]
fn symbol_errors() {
    let so = asm_so();
    let e = place(so, "no_such_symbol").unwrap_err();
    assert_eq!(e, PlacementError::SymbolMissing { symbol: "no_such_symbol".into() });
    assert!(e.is_missing_symbol());
    assert_eq!(e.reason(), "symbol missing");
    assert!(matches!(place(so, "hidden_fn"), Err(PlacementError::NotExported { .. })));
    assert!(matches!(place(so, "puts"), Err(PlacementError::Undefined { .. })));
    let e = place(so, "gobj").unwrap_err();
    assert!(matches!(e, PlacementError::NotAFunction { .. }), "{e}");
    let e = place(so, "ifunc_fn").unwrap_err();
    assert!(e.to_string().contains("indirect function"), "{e}");
    assert!(matches!(place(b"hello", "x"), Err(PlacementError::NotElf(_))));
    assert!(matches!(place(&[], "x"), Err(PlacementError::NotElf(_))));
}

#[test]
fn place_file_reads_once_and_reports_each_symbol() {
    let dir = scratch_dir("file");
    let path = dir.join("libasm.so");
    std::fs::write(&path, asm_so()).unwrap();
    let out = place_file(&path, ["thunk_rel", "nope", "riprel_rax"]);
    assert_eq!(out.len(), 3);
    assert_eq!(out[0].0, "thunk_rel");
    assert_eq!(out[0].1.as_ref().unwrap().kind, PlacementKind::ThunkTarget);
    assert!(out[1].1.as_ref().unwrap_err().is_missing_symbol());
    assert!(out[2].1.is_ok());
    let missing = place_file(dir.join("absent.so"), ["a", "b"]);
    assert!(missing.iter().all(|(_, r)| matches!(r, Err(PlacementError::Io { .. }))));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn describe_is_one_line_with_the_essentials() {
    let p = placed("thunk_rel");
    let d = describe(&p);
    assert!(!d.contains('\n'));
    for needle in ["thunk_rel", "thunk-target", "push rbp", "emulated", "R_X86_64_RELATIVE"] {
        assert!(d.contains(needle), "{needle} in {d}");
    }
    assert!(d.contains(&format!("{:#x}", p.file_offset)));
}

// ---- Robustness ---------------------------------------------------------------------------------

fn small_so() -> &'static [u8] {
    static SO: OnceLock<Vec<u8>> = OnceLock::new();
    SO.get_or_init(|| build_so("small", "c", PLAIN_C, &["-O0", "-fcf-protection=full", "-nostdlib", "-s"]))
}

const NAMES: &[&str] = &["plain_fn", "thunk_rel", "x", ""];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..2048),
                                       name in "[a-z_]{0,8}") {
        let _ = place(&bytes, &name);
    }

    #[test]
    fn never_panics_on_elf_header_with_garbage(tail in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let mut bytes = small_so()[..64].to_vec();
        bytes.extend(tail);
        let _ = place(&bytes, "plain_fn");
    }

    #[test]
    fn never_panics_on_mutated_shared_objects(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..24),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
        which in 0..2usize,
        name in 0..4usize,
    ) {
        let base = if which == 0 { small_so() } else { asm_so() };
        let mut bytes = base.to_vec();
        for (i, v) in edits {
            let at = i.index(bytes.len());
            bytes[at] = v;
        }
        if truncate {
            bytes.truncate(cut.index(bytes.len()));
        }
        let _ = place(&bytes, NAMES[name]);
        let _ = place_for_return(&bytes, NAMES[name]);
    }
}

#[test]
fn untouched_small_so_places() {
    // The base of the mutation test works, so mutations start from a meaningful file.
    let p = place(small_so(), "plain_fn").unwrap();
    assert_eq!(p.kind, PlacementKind::AfterEndbr);
    let names: HashSet<&str> = NAMES.iter().copied().collect();
    assert!(names.contains("plain_fn"));
}
