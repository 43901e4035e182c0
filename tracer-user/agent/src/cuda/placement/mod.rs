//! Where to put a uprobe on an exported function so that the kernel can *emulate* the probed
//! instruction instead of single-stepping it, while the eBPF program still finds the function's
//! arguments where the ABI put them.
//!
//! Pure: ELF bytes in, [`ProbePlacement`] out. No eBPF, no `/proc`, no root. What follows is the
//! x86-64 case; arm64 libraries are placed by the rules of `aarch64` (this module's submodule).
//!
//! # Why
//!
//! A uprobe replaces the first byte of the probed instruction with `int3`. When it fires, the
//! kernel runs the eBPF program and then has to execute the displaced instruction. Linux's x86
//! uprobe code (`arch/x86/kernel/uprobes.c`, `arch_uprobe_analyze_insn`) does that in one of two
//! ways:
//!
//! * **emulates** it in the trap handler (`branch_setup_xol_ops`, `push_setup_xol_ops`): cheap;
//! * otherwise copies it to an out-of-line slot and **single-steps** it there with the trap flag
//!   (`default_xol_ops`, plus `riprel_analyze` fix-ups for rip-relative operands): a second trap.
//!
//! Measured on this project's kernel (`../shared/reference/ebpf-toolchain.md` pitfall 5,
//! `nvidia-abi.md` §6.4): ~0.35–0.74 µs per hit when the first instruction was `push %rbp` or a
//! 5-byte `nop`, ~10 µs when it was `endbr64` or a rip-relative instruction. The real libcuda
//! (535.x) exports every entry point as a thunk whose first instruction is a rip-relative `cmpl`,
//! i.e. the slow class, and jumps through a relocated table slot to an implementation that begins
//! with `push %rbp`.
//!
//! # What counts as "emulated" ([`InsnClass`])
//!
//! The allow-list, derived from the kernel source named above:
//!
//! | instruction | class | source |
//! |---|---|---|
//! | `push r64` encoded `50+r` or `41 50+r` (nothing else: no `48`/`66` prefix, length ≤ 2) | [`InsnClass::Emulated`] | `push_setup_xol_ops`; measured fast (`push %rbp`) |
//! | `nop` (`90`, `66 90`, `48 90`) and `nop r/m` (`0f 1f /0`, the multi-byte nops) | [`InsnClass::Emulated`] | `branch_setup_xol_ops` (`0x90`; `insn_is_nop()` on recent kernels); measured fast (5-byte nop) |
//! | `jmp rel8/rel32`, `call rel32`, `jcc rel8/rel32` without a `66` prefix | [`InsnClass::Emulated`] | `branch_setup_xol_ops` (never chosen as a probe point here: control flow) |
//! | `endbr64` | [`InsnClass::SingleStepped`] | not in either emulation list; measured slow (~10.7 µs) |
//! | anything with a rip-relative memory operand | [`InsnClass::SingleStepped`] | `default_xol_ops` + rip fix-up; measured slow (~10.5 µs) |
//! | everything else (`mov reg, reg`, `sub rsp, imm`, …) | [`InsnClass::Unknown`] | executed out of line without rip fix-up; **not measured** here. On the kernels read, this is the same single-step path, so expect the slow class; patches that emulate `mov`/`sub` exist but are not assumed |
//!
//! Older kernels emulate fewer of these (the `push` and multi-byte `nop` emulation are later
//! additions), so `Emulated` means "emulated on the kernel this was measured on".
//!
//! # Where the probe goes ([`place`])
//!
//! 1. **Thunk following.** If the code at the symbol decodes as
//!    `[endbr64] ; cmp|test <rip-relative mem>, … ; jcc … ; jmp qword ptr [rip+disp]` (the 535
//!    thunk) or as a bare `[endbr64] ; jmp qword ptr [rip+disp]`, optionally with up to three
//!    register self-extensions before the `jmp` (`movzx esi, sil`: 535's `cuMemsetD8`/`D16`
//!    thunks; the target sees the same argument values), the slot address comes from the
//!    decoded rip-relative operand and its content from the file's dynamic relocations:
//!    `R_X86_64_RELATIVE` (the addend is the target's address), `R_X86_64_64` (symbol + addend),
//!    `R_X86_64_GLOB_DAT` / `R_X86_64_JUMP_SLOT` (symbol), each only to a symbol *defined in the same
//!    file* (it assumes that symbol is not interposed at run time). `R_X86_64_IRELATIVE`, a slot
//!    without relocation (filled at run time), or a target outside executable code: not followed.
//!    Followed at most [`MAX_THUNK_HOPS`] times.
//! 2. **Prologue skipping.** At the (possibly followed) function start, the first instruction is
//!    used if it is in the emulated allow-list. Otherwise up to [`MAX_PROLOGUE_SKIP`] instructions
//!    are stepped over while each is *safe*: `endbr64`; or an instruction that is not control flow,
//!    writes no memory, and writes none of `rsp`, `rdi`, `rsi`, `rdx`, `rcx`, `r8`, `r9`,
//!    `xmm0`–`xmm7` (the System V argument registers, integer and vector). Writes to `rax`, `r10`,
//!    `r11`, `rbx`, `rbp`, `r12`–`r15` and flags are allowed: no argument lives there (`al` holds
//!    the vector-register count of a *variadic* call, which is not an argument value). The first
//!    emulated, non-control-flow instruction reached is chosen; failing that, when nothing but
//!    `endbr64` was stepped over, the instruction after it (unknown cost, but not a known-slow
//!    one); failing that, the start itself. Real instructions are never skipped just to reach an
//!    unknown-cost one: on the kernels read it is single-stepped as well, so nothing is gained.
//!    A point after skipped instructions is rejected (back to the start) when any direct branch in
//!    the function (its symbol size, or the next 4 KiB when no symbol gives a size) targets the
//!    skipped range or the point itself, because the probe would then fire again without a call.
//! 3. If the thunk target's best point is single-stepped anyway, the symbol address is used
//!    (same cost, and it only sees calls through the exported entry).
//!
//! Because skipping never passes an instruction that changes `rsp`, the stack at the chosen point
//! is the stack at function entry: [`ProbePlacement::stack_delta`] is 0 with these rules (the
//! field is there so a caller can assert it; a `push` is itself emulated, so there is never a
//! reason to skip one). Arguments are read as at entry: registers per the ABI, stack arguments at
//! `rsp + 8 + 8·k` (the return address is at `rsp`).
//!
//! # Uretprobes
//!
//! A uretprobe is an entry probe that replaces the return address at `[rsp]` with a trampoline
//! (`arch_uretprobe_hijack_return_addr`), so it is valid only where `[rsp]` is still the caller's
//! return address: at function entry, before any push. A thunk's `jmp` does not push, and skipped
//! `endbr64`/safe instructions do not touch `rsp`, so the same placement works for a uretprobe.
//! [`place_for_return`] enforces `stack_delta == 0` and fails otherwise.
//!
//! Caveat of thunk following: calls that take the thunk's conditional early return (535: the
//! flag compare → `mov $4,%eax; ret`, CUDA_ERROR_DEINITIALIZED) never reach the target and are not
//! seen; they do no work. Code inside the library that calls the implementation directly (not
//! through the exported thunk) is seen at the target (535.309.01: no direct call or jump to the
//! implementations of the launch/alloc/free entry points; test
//! `real_libcuda_direct_references_to_implementations`).
//!
//! The slots are writable data, and libcuda 535 has code that saves and rewrites them (535.309.01:
//! two more rip-relative accesses to each slot besides the thunk's `jmp`, a load and a store, in
//! a routine that swaps the whole table, presumably for tools that interpose on the driver API).
//! The placement is what the dynamic loader puts there: checked by loading the library and
//! reading the slots, before and after a `cuInit` that fails for lack of a GPU (test
//! `real_libcuda_slots_hold_the_computed_targets_once_loaded`). With a GPU, or with a profiling
//! tool that swaps the table, that is **not verified**; a caller can compare
//! `base + slot_addr` in `/proc/PID/mem` with `base + target` of a running process.
//!
//! # Offsets for aya
//!
//! [`ProbePlacement::file_offset`] is the offset **in the file** of the probed instruction
//! (`vaddr − p_vaddr + p_offset` of the executable `PT_LOAD` that contains it; equal to aya's own
//! `vaddr − sh_addr + sh_offset`). aya 0.14's `UProbe::attach(point, target, scope)` takes
//! `point: Into<UProbeAttachPoint>`, and `u64` converts to `UProbeAttachLocation::AbsoluteOffset`,
//! which aya passes to the kernel unchanged as the uprobe offset. So:
//! `uprobe.attach(placement.file_offset, "/path/to/libcuda.so.1", UProbeScope::AllProcesses)`.
//! Do **not** pass it as `SymbolOffset(symbol, …)`: the thunk target is elsewhere in the file.
//! Pass a path, not a bare basename (aya resolves basenames through `/proc/PID/maps`).

use std::cell::OnceCell;
use std::collections::HashMap;
use std::fmt::Write as _;

use iced_x86::{
    Code, Decoder, DecoderOptions, FlowControl, Formatter, Instruction, InstructionInfoFactory, IntelFormatter,
    MemorySizeOptions, Mnemonic, OpAccess, OpKind, Register,
};
use object::elf;
use object::read::elf::{ElfFile64, FileHeader, ProgramHeader, Sym};
use object::{Endianness, FileKind, Object, RelocationFlags, RelocationTarget, SymbolIndex};

/// How many `jmp [slot]` thunks are followed in a row at most.
pub(crate) const MAX_THUNK_HOPS: usize = 4;
/// How many instructions at a function start may be stepped over at most.
pub(crate) const MAX_PROLOGUE_SKIP: usize = 4;
/// Bytes decoded at a function start.
const CODE_WINDOW: u64 = 128;
/// Bytes scanned for branches into a skipped prologue when no symbol gives the function's size.
const UNKNOWN_EXTENT_SCAN: u64 = 4096;
/// Upper bound on a symbol size trusted for that scan.
const MAX_EXTENT_SCAN: u64 = 1 << 20;

/// Cost class of the instruction a uprobe is placed on (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InsnClass {
    /// The kernel emulates it in the trap handler (push r64, nop, direct branches). Cheap.
    Emulated,
    /// Known to be executed out of line with a single-step trap (`endbr64`, rip-relative). ~10 µs.
    SingleStepped,
    /// Not on either list; executed out of line, cost not measured here (expect the slow class).
    Unknown,
}

impl InsnClass {
    pub fn as_str(self) -> &'static str {
        match self {
            InsnClass::Emulated => "emulated",
            InsnClass::SingleStepped => "single-stepped",
            InsnClass::Unknown => "unknown cost",
        }
    }
}

/// How the probe point relates to the symbol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PlacementKind {
    /// At the symbol address itself.
    AtSymbol,
    /// After a leading `endbr64` of the function.
    AfterEndbr,
    /// After safe prologue instructions (at least one that is not `endbr64`).
    AfterPrologueSkip,
    /// At the start of the function the symbol's thunk jumps to.
    ThunkTarget,
    /// After a leading `endbr64` of the thunk's target.
    ThunkTargetAfterEndbr,
    /// After safe prologue instructions of the thunk's target.
    ThunkTargetAfterPrologueSkip,
    /// arm64: after a `bti` landing pad and/or (entry probes only) a `pac*sp`.
    AfterLandingPad,
}

impl PlacementKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PlacementKind::AtSymbol => "at-symbol",
            PlacementKind::AfterEndbr => "after-endbr",
            PlacementKind::AfterPrologueSkip => "after-prologue-skip",
            PlacementKind::ThunkTarget => "thunk-target",
            PlacementKind::ThunkTargetAfterEndbr => "thunk-target-after-endbr",
            PlacementKind::ThunkTargetAfterPrologueSkip => "thunk-target-after-prologue-skip",
            PlacementKind::AfterLandingPad => "after-landing-pad",
        }
    }
}

/// One followed thunk: the slot it jumps through and where the slot points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThunkHop {
    /// Address of the thunk (the symbol, or a previous hop's target).
    pub thunk_addr: u64,
    /// Address of the table slot the thunk's `jmp qword ptr [rip+disp]` reads.
    pub slot_addr: u64,
    /// The relocation that fills the slot, e.g. `R_X86_64_RELATIVE`.
    pub relocation: String,
    /// The slot's value: the address jumped to.
    pub target: u64,
}

/// Where to attach a uprobe for one exported function, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbePlacement {
    /// The symbol asked for.
    pub symbol: String,
    /// The symbol's virtual address (`st_value`).
    pub symbol_addr: u64,
    /// Virtual address (as in the ELF file) of the probed instruction.
    pub probe_addr: u64,
    /// Offset of the probed instruction in the file: what aya 0.14's `UProbe::attach` wants as a
    /// `u64` point (`UProbeAttachLocation::AbsoluteOffset`).
    pub file_offset: u64,
    pub kind: PlacementKind,
    /// The instruction at the probe point, Intel syntax (e.g. `push rbp`).
    pub first_insn: String,
    pub first_insn_class: InsnClass,
    /// Bytes pushed between function entry and the probe point (0 with the current rules).
    pub stack_delta: i64,
    /// Thunks followed from the symbol to the probed function, in order.
    pub thunk: Vec<ThunkHop>,
    /// Instructions stepped over at the probed function's start, Intel syntax.
    pub skipped: Vec<String>,
    /// Why this point, in words.
    pub reason: String,
}

impl ProbePlacement {
    /// Whether a uretprobe may use this point (`[rsp]` is the caller's return address).
    pub(crate) fn valid_for_return(&self) -> bool {
        self.stack_delta == 0
    }
}

/// Why no placement could be computed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error("cannot read {path}: {error}")]
    Io { path: String, error: String },
    #[error("not an ELF file: {0}")]
    NotElf(String),
    #[error("unsupported ELF file: {0}")]
    Unsupported(String),
    #[error("symbol {symbol} is not in the dynamic symbol table")]
    SymbolMissing { symbol: String },
    #[error("symbol {symbol} is in .symtab but not exported (.dynsym)")]
    NotExported { symbol: String },
    #[error("symbol {symbol} is undefined here (imported from another object)")]
    Undefined { symbol: String },
    #[error("symbol {symbol} is not a function: {what}")]
    NotAFunction { symbol: String, what: String },
    #[error("cannot read the code of {symbol} at {addr:#x}: {why}")]
    UnreadableCode { symbol: String, addr: u64, why: String },
    #[error("{symbol}: no probe point is valid for a uretprobe: {why}")]
    NotReturnSafe { symbol: String, why: String },
    /// The instruction where the probe would go is one the kernel refuses to probe or cannot
    /// execute safely out of line (arm64: exclusive load/store, `mrs`, `svc`, …).
    #[error("{symbol}: the instruction at {addr:#x} must not be probed: {why}")]
    NotProbeSafe { symbol: String, addr: u64, why: String },
}

impl PlacementError {
    /// A short, stable category for counting and reports (the `Display` text has the details).
    pub fn reason(&self) -> &'static str {
        match self {
            PlacementError::Io { .. } => "unreadable file",
            PlacementError::NotElf(_) => "not an ELF file",
            PlacementError::Unsupported(_) => "unsupported ELF",
            PlacementError::SymbolMissing { .. } => "symbol missing",
            PlacementError::NotExported { .. } => "symbol not exported",
            PlacementError::Undefined { .. } => "symbol undefined",
            PlacementError::NotAFunction { .. } => "not a function",
            PlacementError::UnreadableCode { .. } => "unreadable code",
            PlacementError::NotReturnSafe { .. } => "no return-safe point",
            PlacementError::NotProbeSafe { .. } => "unsafe instruction",
        }
    }

    /// The library simply lacks this entry point (skip and report, not fatal).
    pub(crate) fn is_missing_symbol(&self) -> bool {
        matches!(self, PlacementError::SymbolMissing { .. })
    }
}

/// Placement of a uprobe on `symbol` (exported, defined function) in the ELF file `elf_bytes`.
pub fn place(elf_bytes: &[u8], symbol: &str) -> Result<ProbePlacement, PlacementError> {
    Placer::new(elf_bytes)?.place(symbol)
}

/// Like [`place`], for a uretprobe: fails rather than return a point where `[rsp]` is not the
/// return address.
pub(crate) fn place_for_return(elf_bytes: &[u8], symbol: &str) -> Result<ProbePlacement, PlacementError> {
    Placer::new(elf_bytes)?.place_for_return(symbol)
}

#[cfg(test)]
/// [`place`] for several symbols of one file, read and parsed once. A file-level error is
/// repeated for every symbol.
pub(crate) fn place_file<P, I, S>(path: P, symbols: I) -> Vec<(String, Result<ProbePlacement, PlacementError>)>
where
    P: AsRef<std::path::Path>,
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let path = path.as_ref();
    let names: Vec<String> = symbols.into_iter().map(|s| s.as_ref().to_string()).collect();
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) => {
            let err = PlacementError::Io { path: path.display().to_string(), error: e.to_string() };
            return names.into_iter().map(|n| (n, Err(err.clone()))).collect();
        }
    };
    match Placer::new(&bytes) {
        Ok(placer) => names
            .into_iter()
            .map(|n| {
                let r = placer.place(&n);
                (n, r)
            })
            .collect(),
        Err(err) => names.into_iter().map(|n| (n, Err(err.clone()))).collect(),
    }
}

/// One line for logs and `doctor`.
pub fn describe(p: &ProbePlacement) -> String {
    let mut s = format!(
        "{}: probe {:#x} (file offset {:#x}), {}, first insn `{}` ({})",
        p.symbol,
        p.probe_addr,
        p.file_offset,
        p.kind.as_str(),
        p.first_insn,
        p.first_insn_class.as_str()
    );
    if p.probe_addr != p.symbol_addr {
        let _ = write!(s, ", symbol {:#x}", p.symbol_addr);
    }
    for hop in &p.thunk {
        let _ = write!(s, ", via slot {:#x} {} → {:#x}", hop.slot_addr, hop.relocation, hop.target);
    }
    if !p.skipped.is_empty() {
        let _ = write!(s, ", skipped [{}]", p.skipped.join("; "));
    }
    if p.stack_delta != 0 {
        let _ = write!(s, ", stack {:+}", p.stack_delta);
    }
    s
}

/// An ELF file parsed once, for placing probes on several of its symbols.
pub(crate) struct Placer<'a> {
    data: &'a [u8],
    /// `EM_X86_64` or `EM_AARCH64`.
    machine: u16,
    elf: ElfFile64<'a, Endianness>,
    endian: Endianness,
    loads: Vec<Load>,
    relocs: OnceCell<HashMap<u64, SlotReloc>>,
}

#[derive(Debug, Clone, Copy)]
struct Load {
    vaddr: u64,
    offset: u64,
    filesz: u64,
    exec: bool,
}

#[derive(Debug, Clone, Copy)]
struct SlotReloc {
    r_type: u32,
    sym: Option<SymbolIndex>,
    addend: i64,
    implicit_addend: bool,
}

struct FoundSym {
    addr: u64,
    size: u64,
    note: Option<String>,
}

struct Point {
    addr: u64,
    text: String,
    class: InsnClass,
    skipped: Vec<String>,
    only_endbr: bool,
    note: String,
}

impl<'a> Placer<'a> {
    /// Parse `data` (a 64-bit little-endian x86-64 ELF file).
    pub fn new(data: &'a [u8]) -> Result<Self, PlacementError> {
        match FileKind::parse(data) {
            Ok(FileKind::Elf64) => {}
            Ok(FileKind::Elf32) => {
                return Err(PlacementError::Unsupported("32-bit ELF; only x86-64 and arm64 are handled".into()));
            }
            Ok(other) => return Err(PlacementError::NotElf(format!("{other:?} file"))),
            Err(e) => return Err(PlacementError::NotElf(e.to_string())),
        }
        let elf =
            ElfFile64::<Endianness>::parse(data).map_err(|e| PlacementError::NotElf(format!("malformed ELF: {e}")))?;
        let endian = elf.endian();
        if endian != Endianness::Little {
            return Err(PlacementError::Unsupported("big-endian ELF".into()));
        }
        let machine = elf.elf_header().e_machine(endian);
        if machine != elf::EM_X86_64 && machine != elf::EM_AARCH64 {
            return Err(PlacementError::Unsupported(format!(
                "machine {machine} is neither x86-64 ({}) nor arm64 ({})",
                elf::EM_X86_64,
                elf::EM_AARCH64
            )));
        }
        let loads: Vec<Load> = elf
            .elf_program_headers()
            .iter()
            .filter(|ph| ph.p_type(endian) == elf::PT_LOAD)
            .map(|ph| Load {
                vaddr: ph.p_vaddr(endian),
                offset: ph.p_offset(endian),
                filesz: ph.p_filesz(endian),
                exec: ph.p_flags(endian) & elf::PF_X != 0,
            })
            .collect();
        if !loads.iter().any(|l| l.exec) {
            return Err(PlacementError::Unsupported("no executable PT_LOAD segment".into()));
        }
        Ok(Placer { data, machine, elf, endian, loads, relocs: OnceCell::new() })
    }

    /// See [`place`].
    pub fn place(&self, symbol: &str) -> Result<ProbePlacement, PlacementError> {
        if self.machine == elf::EM_AARCH64 {
            return self.place_aarch64(symbol, false);
        }
        self.place_inner(symbol)
    }

    /// See [`place_for_return`].
    pub(crate) fn place_for_return(&self, symbol: &str) -> Result<ProbePlacement, PlacementError> {
        let p =
            if self.machine == elf::EM_AARCH64 { self.place_aarch64(symbol, true)? } else { self.place_inner(symbol)? };
        if !p.valid_for_return() {
            return Err(PlacementError::NotReturnSafe {
                symbol: symbol.to_string(),
                why: format!("the chosen point {:#x} is {} bytes below the entry stack", p.probe_addr, p.stack_delta),
            });
        }
        Ok(p)
    }

    fn place_inner(&self, symbol: &str) -> Result<ProbePlacement, PlacementError> {
        let found = self.find_symbol(symbol)?;
        let sym_addr = found.addr;
        let unreadable =
            |why: String| PlacementError::UnreadableCode { symbol: symbol.to_string(), addr: sym_addr, why };
        self.code_at(sym_addr, 1).map_err(unreadable)?;

        let mut reason = String::new();
        if let Some(note) = &found.note {
            let _ = write!(reason, "{note}; ");
        }

        // 1. Thunk following.
        let mut hops: Vec<ThunkHop> = Vec::new();
        let mut thunk_texts: Vec<String> = Vec::new();
        let mut cur = sym_addr;
        let mut thunk_note: Option<String> = None;
        while hops.len() < MAX_THUNK_HOPS {
            let Some((slot, text)) = self.match_thunk(cur) else { break };
            match self.resolve_slot(slot) {
                Ok((target, how)) => {
                    if let Err(why) = self.code_at(target, 1) {
                        thunk_note = Some(format!(
                            "thunk at {cur:#x} ({text}) jumps through slot {slot:#x} ({how}) to \
                             {target:#x}, which is not readable code ({why}); not followed"
                        ));
                        break;
                    }
                    if target == cur || hops.iter().any(|h| h.thunk_addr == target) {
                        thunk_note = Some(format!("thunk loop at {target:#x}; not followed"));
                        break;
                    }
                    hops.push(ThunkHop { thunk_addr: cur, slot_addr: slot, relocation: how, target });
                    thunk_texts.push(text);
                    cur = target;
                }
                Err(why) => {
                    thunk_note =
                        Some(format!("thunk at {cur:#x} ({text}) jumps through slot {slot:#x}, not followed: {why}"));
                    break;
                }
            }
        }

        // 2. Prologue skipping at the function actually probed.
        let mut followed = !hops.is_empty();
        let mut point = if followed {
            let extent = self.extent_of(cur);
            let p = self.choose_point(cur, extent).map_err(unreadable)?;
            if p.class == InsnClass::SingleStepped {
                thunk_note = Some(format!(
                    "thunk target {cur:#x} starts with `{}`, single-stepped as well; probing the \
                     symbol instead",
                    p.text
                ));
                followed = false;
                hops.clear();
                thunk_texts.clear();
                None
            } else {
                Some(p)
            }
        } else {
            None
        };
        if point.is_none() {
            let extent = (found.size > 0).then_some(found.size);
            point = Some(self.choose_point(sym_addr, extent).map_err(unreadable)?);
        }
        let point = point.expect("set above");

        let kind = match (followed, point.skipped.is_empty(), point.only_endbr) {
            (false, true, _) => PlacementKind::AtSymbol,
            (false, false, true) => PlacementKind::AfterEndbr,
            (false, false, false) => PlacementKind::AfterPrologueSkip,
            (true, true, _) => PlacementKind::ThunkTarget,
            (true, false, true) => PlacementKind::ThunkTargetAfterEndbr,
            (true, false, false) => PlacementKind::ThunkTargetAfterPrologueSkip,
        };

        for (hop, text) in hops.iter().zip(&thunk_texts) {
            let _ = write!(
                reason,
                "thunk at {:#x}: {text} → slot {:#x} filled by {} → {:#x}; ",
                hop.thunk_addr, hop.slot_addr, hop.relocation, hop.target
            );
        }
        if let Some(note) = &thunk_note {
            let _ = write!(reason, "{note}; ");
        }
        if !point.skipped.is_empty() {
            let _ = write!(reason, "skipped [{}]; ", point.skipped.join("; "));
        }
        let where_ = if followed { "target" } else { "function" };
        let _ = write!(reason, "{where_} probed at {:#x} on `{}` ({})", point.addr, point.text, point.class.as_str());
        if !point.note.is_empty() {
            let _ = write!(reason, "; {}", point.note);
        }

        let file_offset =
            self.file_offset(point.addr).ok_or_else(|| unreadable(format!("{:#x} has no file offset", point.addr)))?;
        Ok(ProbePlacement {
            symbol: symbol.to_string(),
            symbol_addr: sym_addr,
            probe_addr: point.addr,
            file_offset,
            kind,
            first_insn: point.text,
            first_insn_class: point.class,
            stack_delta: 0,
            thunk: hops,
            skipped: point.skipped,
            reason,
        })
    }

    // ---- ELF helpers -------------------------------------------------------------------------

    fn find_symbol(&self, name: &str) -> Result<FoundSym, PlacementError> {
        let e = self.endian;
        let table = self.elf.elf_dynamic_symbol_table();
        let strings = table.strings();
        let matches: Vec<&elf::Sym64<Endianness>> =
            table.iter().filter(|s| s.name(e, strings).map(|n| n == name.as_bytes()).unwrap_or(false)).collect();
        if matches.is_empty() {
            let stab = self.elf.elf_symbol_table();
            let sstr = stab.strings();
            let in_symtab = stab.iter().any(|s| s.name(e, sstr).map(|n| n == name.as_bytes()).unwrap_or(false));
            return Err(if in_symtab {
                PlacementError::NotExported { symbol: name.to_string() }
            } else {
                PlacementError::SymbolMissing { symbol: name.to_string() }
            });
        }
        let defined: Vec<&&elf::Sym64<Endianness>> =
            matches.iter().filter(|s| s.st_shndx(e) != elf::SHN_UNDEF).collect();
        if defined.is_empty() {
            return Err(PlacementError::Undefined { symbol: name.to_string() });
        }
        let funcs: Vec<&&elf::Sym64<Endianness>> =
            defined.iter().copied().filter(|s| s.st_type() == elf::STT_FUNC).collect();
        let Some(first) = funcs.first() else {
            let what = match defined[0].st_type() {
                elf::STT_GNU_IFUNC => {
                    "GNU indirect function (its address is the resolver, not the implementation)".to_string()
                }
                elf::STT_OBJECT => "data object".to_string(),
                elf::STT_NOTYPE => "no type (STT_NOTYPE)".to_string(),
                elf::STT_TLS => "thread-local data".to_string(),
                t => format!("symbol type {t}"),
            };
            return Err(PlacementError::NotAFunction { symbol: name.to_string(), what });
        };
        let addr = first.st_value(e);
        let size = first.st_size(e);
        let note = funcs
            .iter()
            .any(|s| s.st_value(e) != addr)
            .then(|| format!("several versions of {name} at different addresses; using {addr:#x}"));
        Ok(FoundSym { addr, size, note })
    }

    fn load_of(&self, vaddr: u64) -> Option<&Load> {
        self.loads.iter().find(|l| vaddr >= l.vaddr && vaddr - l.vaddr < l.filesz)
    }

    /// File offset of a virtual address backed by file content.
    fn file_offset(&self, vaddr: u64) -> Option<u64> {
        let l = self.load_of(vaddr)?;
        let off = l.offset.checked_add(vaddr - l.vaddr)?;
        (off < self.data.len() as u64).then_some(off)
    }

    /// Up to `max` bytes of executable, file-backed code starting at `vaddr`.
    fn code_at(&self, vaddr: u64, max: u64) -> Result<&'a [u8], String> {
        let l = self
            .loads
            .iter()
            .find(|l| l.exec && vaddr >= l.vaddr && vaddr - l.vaddr < l.filesz)
            .ok_or_else(|| format!("{vaddr:#x} is not in an executable segment"))?;
        let start = l.offset.checked_add(vaddr - l.vaddr).ok_or_else(|| "offset overflow".to_string())?;
        let seg_end = l.offset.saturating_add(l.filesz).min(self.data.len() as u64);
        let end = start.saturating_add(max).min(seg_end);
        if start >= end {
            return Err(format!("{vaddr:#x} lies beyond the end of the file"));
        }
        self.data.get(start as usize..end as usize).ok_or_else(|| format!("{vaddr:#x} lies beyond the end of the file"))
    }

    fn read_u64(&self, vaddr: u64) -> Option<u64> {
        let off = self.file_offset(vaddr)? as usize;
        let b = self.data.get(off..off.checked_add(8)?)?;
        Some(u64::from_le_bytes(b.try_into().ok()?))
    }

    fn relocs(&self) -> &HashMap<u64, SlotReloc> {
        self.relocs.get_or_init(|| {
            let mut map = HashMap::new();
            if let Some(iter) = self.elf.dynamic_relocations() {
                for (offset, r) in iter {
                    let RelocationFlags::Elf { r_type } = r.flags() else { continue };
                    let sym = match r.target() {
                        RelocationTarget::Symbol(i) => Some(i),
                        _ => None,
                    };
                    map.insert(
                        offset,
                        SlotReloc { r_type, sym, addend: r.addend(), implicit_addend: r.has_implicit_addend() },
                    );
                }
            }
            map
        })
    }

    /// The address a relocated slot holds once the library is loaded (relative to its base).
    fn resolve_slot(&self, slot: u64) -> Result<(u64, String), String> {
        let Some(r) = self.relocs().get(&slot).copied() else {
            return Err("no dynamic relocation writes the slot, so its value is only known at run time".to_string());
        };
        let addend = if r.implicit_addend { self.read_u64(slot).map(|v| v as i64).unwrap_or(0) } else { r.addend };
        let e = self.endian;
        match r.r_type {
            elf::R_X86_64_RELATIVE => Ok((addend as u64, "R_X86_64_RELATIVE".to_string())),
            elf::R_X86_64_64 | elf::R_X86_64_GLOB_DAT | elf::R_X86_64_JUMP_SLOT => {
                let rname = match r.r_type {
                    elf::R_X86_64_64 => "R_X86_64_64",
                    elf::R_X86_64_GLOB_DAT => "R_X86_64_GLOB_DAT",
                    _ => "R_X86_64_JUMP_SLOT",
                };
                let index = r.sym.ok_or_else(|| format!("{rname} without a symbol"))?;
                let table = self.elf.elf_dynamic_symbol_table();
                let sym = table.symbol(index).map_err(|e| format!("{rname}: {e}"))?;
                let sname = sym
                    .name(e, table.strings())
                    .map(|n| String::from_utf8_lossy(n).into_owned())
                    .unwrap_or_else(|_| format!("#{}", index.0));
                if sym.st_shndx(e) == elf::SHN_UNDEF {
                    return Err(format!("{rname} against {sname}, which another object defines"));
                }
                match sym.st_type() {
                    elf::STT_FUNC | elf::STT_NOTYPE => {}
                    elf::STT_GNU_IFUNC => {
                        return Err(format!("{rname} against {sname}, an indirect function"));
                    }
                    t => return Err(format!("{rname} against {sname}, of symbol type {t}")),
                }
                let value = sym.st_value(e);
                let target =
                    if r.r_type == elf::R_X86_64_64 { (value as i64).wrapping_add(addend) as u64 } else { value };
                let preemptible = sym.st_bind() != elf::STB_LOCAL && sym.st_visibility() == elf::STV_DEFAULT;
                let how = if preemptible {
                    format!("{rname} {sname} (assuming it is not interposed)")
                } else {
                    format!("{rname} {sname}")
                };
                Ok((target, how))
            }
            elf::R_X86_64_IRELATIVE => Err("R_X86_64_IRELATIVE: an ifunc resolver fills it at load time".to_string()),
            t => Err(format!("relocation type {t} is not understood")),
        }
    }

    /// Size of the function starting at `addr`, from any symbol table.
    fn extent_of(&self, addr: u64) -> Option<u64> {
        let e = self.endian;
        for table in [self.elf.elf_symbol_table(), self.elf.elf_dynamic_symbol_table()] {
            for s in table.iter() {
                if s.st_value(e) == addr
                    && s.st_size(e) > 0
                    && s.st_shndx(e) != elf::SHN_UNDEF
                    && matches!(s.st_type(), elf::STT_FUNC | elf::STT_NOTYPE)
                {
                    return Some(s.st_size(e));
                }
            }
        }
        None
    }

    // ---- Instruction helpers -----------------------------------------------------------------
}

mod aarch64;
mod x86;

#[cfg(test)]
mod tests;
