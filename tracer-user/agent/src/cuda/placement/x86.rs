//! Reading x86-64 code (iced-x86): the thunk a symbol may be, what the kernel does with an
//! instruction a uprobe replaces (emulated, single-stepped, refused), and the probe point past an
//! `endbr64` and the instructions that touch neither the stack nor an argument register.
use super::*;

impl<'a> Placer<'a> {
    pub(super) fn decoder(&self, addr: u64, max: u64) -> Result<Decoder<'a>, String> {
        let code = self.code_at(addr, max)?;
        Ok(Decoder::with_ip(64, code, addr, DecoderOptions::NONE))
    }

    /// Raw bytes of a decoded instruction.
    pub(super) fn insn_bytes(&self, insn: &Instruction) -> &'a [u8] {
        self.code_at(insn.ip(), insn.len() as u64).unwrap_or(&[])
    }

    /// `Some((slot, text))` when the code at `addr` is a thunk that jumps through a slot:
    /// `[endbr64] ; [cmp|test <rip-relative>, … ; jcc …] ; <extension>* ; jmp qword ptr [rip+d]`,
    /// where each `<extension>` only zero- or sign-extends a register into itself (535's
    /// `cuMemsetD8`/`D16` thunks do `movzx esi, sil` before the jump): the target then sees the
    /// same argument values, with the upper bits the ABI leaves undefined cleaned.
    pub(super) fn match_thunk(&self, addr: u64) -> Option<(u64, String)> {
        const MAX_EXTENSIONS: usize = 3;
        let mut dec = self.decoder(addr, 64).ok()?;
        let mut insns: Vec<Instruction> = Vec::with_capacity(8);
        while insns.len() < 4 + MAX_EXTENSIONS && dec.can_decode() {
            let i = dec.decode();
            if i.is_invalid() {
                break;
            }
            insns.push(i);
        }
        let mut at = 0;
        if insns.first().map(|i| i.mnemonic()) == Some(Mnemonic::Endbr64) {
            at = 1;
        }
        let is_guard = |pair: &[Instruction]| {
            matches!(pair[0].mnemonic(), Mnemonic::Cmp | Mnemonic::Test)
                && pair[0].is_ip_rel_memory_operand()
                && pair[1].is_jcc_short_or_near()
        };
        if insns.len() >= at + 2 && is_guard(&insns[at..at + 2]) {
            at += 2;
        }
        let mut extensions = 0;
        while insns.get(at).is_some_and(is_self_extension) && extensions < MAX_EXTENSIONS {
            at += 1;
            extensions += 1;
        }
        let jmp = insns.get(at)?;
        if !(jmp.code() == Code::Jmp_rm64 && jmp.op0_kind() == OpKind::Memory && jmp.is_ip_rel_memory_operand()) {
            return None;
        }
        let text = insns[..=at].iter().map(fmt_insn).collect::<Vec<_>>().join("; ");
        Some((jmp.ip_rel_memory_address(), text))
    }

    pub(super) fn classify(&self, insn: &Instruction) -> InsnClass {
        let bytes = self.insn_bytes(insn);
        match insn.code() {
            Code::Push_r64 => {
                let ok = match bytes {
                    [b] => (0x50..=0x57).contains(b),
                    [0x41, b] => (0x50..=0x57).contains(b),
                    _ => false,
                };
                if ok {
                    return InsnClass::Emulated;
                }
            }
            Code::Nopw | Code::Nopd | Code::Nopq | Code::Nop_rm16 | Code::Nop_rm32 | Code::Nop_rm64 => {
                return InsnClass::Emulated;
            }
            _ => {}
        }
        let direct_branch = insn.op0_kind() == OpKind::NearBranch64
            && (insn.is_jmp_short_or_near() || insn.is_jcc_short_or_near() || insn.is_call_near());
        // The kernel refuses direct branches with a 0x66 prefix.
        if direct_branch && !legacy_prefixes(bytes).contains(&0x66) {
            return InsnClass::Emulated;
        }
        if insn.mnemonic() == Mnemonic::Endbr64 || insn.is_ip_rel_memory_operand() {
            return InsnClass::SingleStepped;
        }
        InsnClass::Unknown
    }

    /// Pick the probe point at a function start (see the module documentation, step 2).
    pub(super) fn choose_point(&self, start: u64, extent: Option<u64>) -> Result<Point, String> {
        let mut dec = self.decoder(start, CODE_WINDOW)?;
        let mut factory = InstructionInfoFactory::new();
        let mut skipped: Vec<String> = Vec::new();
        let mut only_endbr = true;
        // (addr, text, class, skipped so far, only_endbr)
        let mut emulated: Option<(u64, String, InsnClass, Vec<String>, bool)> = None;
        let mut unknown: Option<(u64, String, InsnClass, Vec<String>, bool)> = None;
        let mut at_start: Option<(u64, String, InsnClass)> = None;
        let mut stop = String::new();
        for step in 0..=MAX_PROLOGUE_SKIP {
            if !dec.can_decode() {
                stop = "ran out of code".into();
                break;
            }
            let insn = dec.decode();
            if insn.is_invalid() {
                stop = format!("undecodable bytes at {:#x}", insn.ip());
                break;
            }
            let class = self.classify(&insn);
            let text = fmt_insn(&insn);
            if step == 0 {
                at_start = Some((insn.ip(), text.clone(), class));
            }
            let plain = insn.flow_control() == FlowControl::Next;
            if class == InsnClass::Emulated && plain {
                emulated = Some((insn.ip(), text, class, skipped.clone(), only_endbr));
                break;
            }
            if class == InsnClass::Unknown && plain && unknown.is_none() && only_endbr {
                unknown = Some((insn.ip(), text.clone(), class, skipped.clone(), only_endbr));
            }
            if step == MAX_PROLOGUE_SKIP {
                stop = format!("no emulated instruction within {MAX_PROLOGUE_SKIP} instructions");
                break;
            }
            match skip_safety(&insn, &mut factory) {
                Ok(()) => {
                    only_endbr &= insn.mnemonic() == Mnemonic::Endbr64;
                    skipped.push(text);
                }
                Err(why) => {
                    stop = format!("stopped at `{text}`: {why}");
                    break;
                }
            }
        }
        let (start_addr, start_text, start_class) =
            at_start.ok_or_else(|| if stop.is_empty() { "no code".to_string() } else { stop.clone() })?;

        let mut notes: Vec<String> = Vec::new();
        for cand in [emulated, unknown].into_iter().flatten() {
            let (addr, text, class, skipped, only_endbr) = cand;
            if addr != start {
                if let Some((from, scanned)) = self.branch_into(start, addr, extent) {
                    notes.push(format!(
                        "not after the prologue at {addr:#x}: the branch at {from:#x} lands in the \
                         skipped range ({scanned})"
                    ));
                    continue;
                }
                if extent.is_none() {
                    notes.push(format!(
                        "function size unknown: scanned {UNKNOWN_EXTENT_SCAN} bytes for branches \
                         into the skipped range"
                    ));
                }
            }
            if class == InsnClass::Unknown && !stop.is_empty() {
                notes.push(stop.clone());
            }
            return Ok(Point { addr, text, class, skipped, only_endbr, note: notes.join("; ") });
        }
        if !stop.is_empty() {
            notes.push(stop);
        }
        Ok(Point {
            addr: start_addr,
            text: start_text,
            class: start_class,
            skipped: Vec::new(),
            only_endbr: false,
            note: notes.join("; "),
        })
    }

    /// A direct branch in the function at `start` whose target is in `(start, point]`.
    pub(super) fn branch_into(&self, start: u64, point: u64, extent: Option<u64>) -> Option<(u64, String)> {
        let (len, scanned) = match extent {
            Some(n) => (n.min(MAX_EXTENT_SCAN), format!("function is {n} bytes")),
            None => (UNKNOWN_EXTENT_SCAN, format!("scanned {UNKNOWN_EXTENT_SCAN} bytes")),
        };
        let mut dec = match self.decoder(start, len) {
            Ok(d) => d,
            Err(e) => return Some((start, e)),
        };
        let mut insn = Instruction::default();
        while dec.can_decode() {
            dec.decode_out(&mut insn);
            if insn.is_invalid() {
                continue;
            }
            // Direct jmp/jcc/call, and loop/jrcxz/xbegin: the target is op0.
            let target = match insn.op0_kind() {
                OpKind::NearBranch64 | OpKind::NearBranch32 | OpKind::NearBranch16 => insn.near_branch_target(),
                _ => continue,
            };
            if target > start && target <= point {
                return Some((insn.ip(), scanned));
            }
        }
        None
    }
}

/// `movzx`/`movsx`/`movsxd`/`mov r32` from a register into the same full register: keeps the
/// value of the narrower argument type, only defines the upper bits.
pub(super) fn is_self_extension(insn: &Instruction) -> bool {
    let regs = insn.op_count() == 2
        && insn.op0_kind() == OpKind::Register
        && insn.op1_kind() == OpKind::Register
        && insn.op0_register().full_register() == insn.op1_register().full_register();
    regs && match insn.mnemonic() {
        Mnemonic::Movzx | Mnemonic::Movsx | Mnemonic::Movsxd => true,
        Mnemonic::Mov => insn.op0_register() == insn.op1_register() && insn.op0_register().is_gpr32(),
        _ => false,
    }
}

/// Whether executing `insn` before the probe leaves everything the probe reads as at entry.
pub(super) fn skip_safety(insn: &Instruction, factory: &mut InstructionInfoFactory) -> Result<(), String> {
    if insn.mnemonic() == Mnemonic::Endbr64 {
        return Ok(());
    }
    if insn.flow_control() != FlowControl::Next {
        return Err("control flow".into());
    }
    if insn.is_stack_instruction() {
        return Err("changes rsp".into());
    }
    let info = factory.info(insn);
    for ur in info.used_registers() {
        if !is_write(ur.access()) {
            continue;
        }
        let full = ur.register().full_register();
        if full == Register::RSP {
            return Err("changes rsp".into());
        }
        if is_argument_register(full) {
            return Err(format!("writes argument register {}", reg_name(ur.register())));
        }
    }
    if info.used_memory().iter().any(|m| is_write(m.access())) {
        return Err("writes memory".into());
    }
    Ok(())
}

/// The legacy and REX prefix bytes at the start of an encoded instruction.
pub(super) fn legacy_prefixes(bytes: &[u8]) -> &[u8] {
    let n = bytes
        .iter()
        .take_while(|b| {
            matches!(b, 0x66 | 0x67 | 0xf0 | 0xf2 | 0xf3 | 0x26 | 0x2e | 0x36 | 0x3e | 0x64 | 0x65)
                || (0x40..=0x4f).contains(*b)
        })
        .count();
    &bytes[..n.min(bytes.len().saturating_sub(1))]
}

pub(super) fn is_write(a: OpAccess) -> bool {
    matches!(a, OpAccess::Write | OpAccess::CondWrite | OpAccess::ReadWrite | OpAccess::ReadCondWrite)
}

pub(super) fn is_argument_register(full: Register) -> bool {
    matches!(
        full,
        Register::RDI
            | Register::RSI
            | Register::RDX
            | Register::RCX
            | Register::R8
            | Register::R9
            | Register::ZMM0
            | Register::ZMM1
            | Register::ZMM2
            | Register::ZMM3
            | Register::ZMM4
            | Register::ZMM5
            | Register::ZMM6
            | Register::ZMM7
    )
}

pub(super) fn reg_name(r: Register) -> String {
    format!("{r:?}").to_lowercase()
}

pub(super) fn fmt_insn(insn: &Instruction) -> String {
    let mut f = IntelFormatter::new();
    let o = f.options_mut();
    o.set_hex_prefix("0x");
    o.set_hex_suffix("");
    o.set_uppercase_hex(false);
    o.set_space_after_operand_separator(true);
    o.set_rip_relative_addresses(false);
    o.set_branch_leading_zeros(false);
    o.set_leading_zeros(false);
    o.set_memory_size_options(MemorySizeOptions::Always);
    let mut out = String::new();
    f.format(insn, &mut out);
    out
}
