//! Probe placement on arm64 (AArch64) libraries: Grace nodes (GH200, GB200/GB300).
//!
//! # What the kernel does with the probed instruction
//!
//! An arm64 uprobe replaces the instruction with `brk`; when it fires the kernel runs the eBPF
//! program, then executes the displaced instruction in one of three ways
//! (`arch/arm64/kernel/probes/decode-insn.c`, `arm_probe_decode_insn`, and `uprobes.c`,
//! `arch_uprobe_analyze_insn`, which refuses the probe for `INSN_REJECTED`):
//!
//! * **simulated** in the handler, no second exception ([`InsnClass::Emulated`]): `b`, `bl`,
//!   `b.cond`, `cbz`/`cbnz`, `tbz`/`tbnz`, `adr`/`adrp`, `br`/`blr`/`ret`, `ldr`/`ldrsw` (literal);
//! * **single-stepped out of line** ([`InsnClass::SingleStepped`]: a second exception): everything
//!   the kernel calls steppable — ordinary loads, stores, arithmetic, `stp`, `sub sp`, and the
//!   whitelisted hints (`nop`, `bti`, `paciasp`/`pacibsp`/`paciaz`/`pacibz`, `xpaclri`);
//! * **rejected** ([`classify`] → `Err`): probing it is refused or unsafe. Exclusive and
//!   ordered loads/stores (the whole `ldxr`/`stxr`/`ldar`/`stlr`/`cas` class: a single-step between
//!   an exclusive pair never completes), `prfm` (literal), SIMD/FP `ldr` (literal: PC-relative,
//!   which the kernel does not simulate and which reads the wrong address from the XOL slot),
//!   `msr`/`mrs`, exception generation (`svc`, `hvc`, `smc`, `brk`, `hlt`, …), `eret`, branches
//!   with pointer authentication (`braa`, `blraa`, `retaa`, …: branches, not simulated), and every
//!   hint outside the whitelist (`autiasp` among them: it may fault).
//!
//! # Where the probe goes ([`Placer::place_aarch64`])
//!
//! At the symbol, unless its first instruction is a `bti` landing pad or a pointer-authentication
//! `pac*` (both single-stepped, never simulated) *and* the next instruction is simulated: then past
//! it (at most two: `bti c; paciasp`), because neither changes `sp` or an argument register. A
//! return probe never goes past a `pac*`: a uretprobe replaces the return address in `x30` with its
//! trampoline, and that has to happen before `paciasp` signs `x30`, otherwise the function's
//! `autiasp` fails on the unsigned trampoline address and the process faults (the shape of the
//! machine-wide crashes a vendor's CUDA uprobes caused on Grace). Stack arguments are at `sp` as at
//! entry with these rules (nothing skipped moves `sp`).
//!
//! Thunks are not followed here. libcuda 535 for arm64 exports its entry points as thunks that begin
//! with `adrp` (simulated: the cheapest class on arm64), and the implementations begin with `stp` or
//! `sub sp` (single-stepped): the symbol is the better point, and it sees every call through the
//! export (also the ones that take the thunk's early return, which do no work).
use super::*;

/// The decoded first instruction: its class, and a short text for reports.
pub(super) struct A64Insn {
    pub class: InsnClass,
    pub text: String,
}

/// Why an instruction must not be probed.
pub(super) type Rejected = String;

fn is_bti(insn: u32) -> bool {
    // BTI, BTI c, BTI j, BTI jc: HINT #32/#34/#36/#38.
    matches!(insn, 0xD503_241F | 0xD503_245F | 0xD503_249F | 0xD503_24DF)
}

fn is_pac_sign(insn: u32) -> bool {
    // PACIASP, PACIBSP, PACIAZ, PACIBZ: they sign x30, the return address.
    matches!(insn, 0xD503_233F | 0xD503_237F | 0xD503_231F | 0xD503_235F)
}

/// The kernel's classification of one A64 instruction for a uprobe (see the module documentation).
pub(super) fn classify(insn: u32) -> Result<A64Insn, Rejected> {
    let sim = |t: &str| Ok(A64Insn { class: InsnClass::Emulated, text: t.to_string() });
    let step = |t: &str| Ok(A64Insn { class: InsnClass::SingleStepped, text: t.to_string() });
    let raw = format!(".inst {insn:#010x}");
    // Simulated by the kernel.
    if insn & 0x9F00_0000 == 0x9000_0000 {
        return sim("adrp");
    }
    if insn & 0x9F00_0000 == 0x1000_0000 {
        return sim("adr");
    }
    if insn & 0x7C00_0000 == 0x1400_0000 {
        return sim(if insn & 0x8000_0000 != 0 { "bl" } else { "b" });
    }
    if insn & 0xFF00_0010 == 0x5400_0000 {
        return sim("b.cond");
    }
    if insn & 0x7E00_0000 == 0x3400_0000 {
        return sim(if insn & 0x0100_0000 != 0 { "cbnz" } else { "cbz" });
    }
    if insn & 0x7E00_0000 == 0x3600_0000 {
        return sim(if insn & 0x0100_0000 != 0 { "tbnz" } else { "tbz" });
    }
    match insn & 0xFFFF_FC1F {
        0xD61F_0000 => return sim("br"),
        0xD63F_0000 => return sim("blr"),
        0xD65F_0000 => return sim("ret"),
        _ => {}
    }
    if insn & 0xBF00_0000 == 0x1800_0000 {
        return sim("ldr (literal)");
    }
    if insn & 0xFF00_0000 == 0x9800_0000 {
        return sim("ldrsw (literal)");
    }
    // Refused or unsafe.
    if insn & 0xFF00_0000 == 0xD800_0000 {
        return Err(format!("{raw}: prfm (literal) is neither simulated nor steppable"));
    }
    if insn & 0x3F00_0000 == 0x1C00_0000 {
        return Err(format!("{raw}: SIMD/FP ldr (literal) is PC-relative and not simulated"));
    }
    if insn & 0x3F00_0000 == 0x0800_0000 {
        return Err(format!("{raw}: exclusive/ordered load-store (ldxr/stxr/ldar/stlr/cas class)"));
    }
    if insn & 0xFE00_0000 == 0xD600_0000 {
        return Err(format!("{raw}: branch to register with pointer authentication, or eret"));
    }
    if insn & 0xFF00_0000 == 0xD400_0000 {
        return Err(format!("{raw}: exception generation (svc/hvc/smc/brk/hlt)"));
    }
    if insn & 0xFFFF_F01F == 0xD503_201F {
        return if insn == 0xD503_201F {
            step("nop")
        } else if is_bti(insn) {
            step("bti")
        } else if is_pac_sign(insn) {
            step("pac*sp")
        } else if insn == 0xD503_20FF {
            step("xpaclri")
        } else {
            Err(format!("{raw}: a hint the kernel does not single-step (e.g. autiasp)"))
        };
    }
    if insn & 0xFFF0_0000 == 0xD530_0000 {
        return Err(format!("{raw}: mrs reads the wrong value when single-stepped"));
    }
    if insn & 0xFFF0_0000 == 0xD510_0000 || insn & 0xFFF8_F01F == 0xD500_401F {
        return Err(format!("{raw}: msr"));
    }
    if insn & 0xFFC0_0000 == 0xA980_0000 {
        return step("stp (pre-index)");
    }
    if insn & 0xFF80_03FF == 0xD100_03FF {
        return step("sub sp, sp, #imm");
    }
    step(&raw)
}

/// The probe point among a function's first instructions `words`: its index, its decoding and the
/// instructions skipped (see the module documentation). An error when the first instruction must
/// not be probed.
pub(super) fn choose_point(words: &[u32], for_return: bool) -> Result<(usize, A64Insn, Vec<String>), Rejected> {
    let first = classify(words[0])?;
    let mut i = 0;
    // Past a landing pad and (entry probes only) a return-address signature, up to a simulated
    // instruction; otherwise the first instruction.
    while i < 2 && i + 1 < words.len() && (is_bti(words[i]) || (!for_return && is_pac_sign(words[i]))) {
        i += 1;
        match classify(words[i]) {
            Ok(d) if d.class == InsnClass::Emulated => {
                let skipped = words[..i].iter().filter_map(|w| classify(*w).ok()).map(|d| d.text).collect();
                return Ok((i, d, skipped));
            }
            _ => {}
        }
    }
    Ok((0, first, Vec::new()))
}

impl Placer<'_> {
    fn word_at(&self, vaddr: u64) -> Result<u32, String> {
        let b = self.code_at(vaddr, 4)?;
        let b: [u8; 4] = b.try_into().map_err(|_| format!("{vaddr:#x}: fewer than 4 bytes of code"))?;
        Ok(u32::from_le_bytes(b))
    }

    /// Placement on an arm64 library (see the module documentation).
    pub(super) fn place_aarch64(&self, symbol: &str, for_return: bool) -> Result<ProbePlacement, PlacementError> {
        let found = self.find_symbol(symbol)?;
        let sym_addr = found.addr;
        let unreadable =
            |why: String| PlacementError::UnreadableCode { symbol: symbol.to_string(), addr: sym_addr, why };
        let words: Vec<u32> = (0..3).map_while(|i| self.word_at(sym_addr + 4 * i).ok()).collect();
        if words.is_empty() {
            return Err(unreadable(format!("{sym_addr:#x}: no code")));
        }
        let (index, decoded, skipped) = choose_point(&words, for_return)
            .map_err(|why| PlacementError::NotProbeSafe { symbol: symbol.to_string(), addr: sym_addr, why })?;
        let addr = sym_addr + 4 * index as u64;
        let kind = if skipped.is_empty() { PlacementKind::AtSymbol } else { PlacementKind::AfterLandingPad };
        let mut reason = String::new();
        if let Some(note) = &found.note {
            let _ = write!(reason, "{note}; ");
        }
        if !skipped.is_empty() {
            let _ = write!(reason, "skipped [{}]; ", skipped.join("; "));
        }
        let _ = write!(reason, "arm64: probed at {addr:#x} on `{}` ({})", decoded.text, decoded.class.as_str());
        if for_return && words.iter().take(2).any(|w| is_pac_sign(*w)) {
            let _ = write!(reason, "; a return probe stays before the return address is signed");
        }
        let file_offset = self.file_offset(addr).ok_or_else(|| unreadable(format!("{addr:#x} has no file offset")))?;
        Ok(ProbePlacement {
            symbol: symbol.to_string(),
            symbol_addr: sym_addr,
            probe_addr: addr,
            file_offset,
            kind,
            first_insn: decoded.text,
            first_insn_class: decoded.class,
            stack_delta: 0,
            thunk: Vec::new(),
            skipped,
            reason,
        })
    }
}

#[cfg(test)]
mod tests;
