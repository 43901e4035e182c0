//! `nv-workload`: a program that behaves like a CUDA application at the ioctl level.
//!
//! It opens the device files in a device directory (`--dev-dir`, default `/dev`; in tests the
//! fake driver's FUSE mount) and issues the driver calls a CUDA process issues, one phase per
//! command, so a test controls exactly what happens when. Commands come one per line on stdin and
//! each gets exactly one answer line on stdout, flushed: `ok [key=value ...]` or
//! `err [key=value ...]` (errors carry `op=<ioctl/syscall>` and `status=0x..` for an RM status or
//! `errno=N` for a failed syscall). Numbers accept decimal or `0x` hex; sizes also accept
//! `K`/`M`/`G`/`T` (binary, optionally followed by `iB`). See [`HELP`] for the command list.
//!
//! With a `libcuda.so.1` loaded ([`CudaLikeClient::load_libcuda`], `nv-workload --libcuda PATH`)
//! the `cuda-*` commands ([`cuda`]) call the CUDA driver API as well.

pub mod cuda;
pub mod encode;
pub mod sys;

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tracer_common::nv::{self, DriverAbi, DriverVersion, class, ctrl, esc, off, size, uvm};

use crate::fake_driver::rm::version_string;
use crate::le::{put_u32, put_u64, u32_at};
use encode::{MemLocation, RmAllocArgs};

/// The command reference printed by `help` and `nv-workload --help`.
pub const HELP: &str = concat!(
    "\
init <gpu>                       open nvidiactl, CHECK_VERSION_STR, CARD_INFO, RM_ALLOC client (NVOS64),
                                 open nvidia<gpu> + REGISTER_FD, RM_ALLOC device (0x80) + subdevice (0x2080),
                                 RM_CONTROLs, open nvidia-uvm + UVM_INITIALIZE + UVM_REGISTER_GPU
                                 -> ok client=0x.. device=0x.. subdevice=0x..
alloc-rm <bytes> [vidmem|sysmem]      RM_ALLOC class 0x40/0x3e, NVOS64 form -> ok handle=0x..
alloc-rm21 <bytes> [vidmem|sysmem]    the same through the 32-byte NVOS21 form -> ok handle=0x..
alloc-vidheap <bytes> [vidmem|sysmem] RM_VID_HEAP_CONTROL ALLOC_SIZE -> ok handle=0x..
alloc-memory <bytes> [vidmem|sysmem]  RM_ALLOC_MEMORY (NVOS02) on the GPU fd -> ok handle=0x..
dup-object <handle>              RM_DUP_OBJECT of <handle> within the client -> ok handle=0x..
free <handle>                    RM_FREE -> ok
free-vidheap <handle>            RM_VID_HEAP_CONTROL FREE -> ok
free-client                      RM_FREE hObjectOld=hRoot -> ok
control                          one RM_CONTROL (GPU_GET_ATTACHED_IDS), a call that only counts -> ok
uvm-map-external <handle> <bytes>     UVM_CREATE_EXTERNAL_RANGE + UVM_MAP_EXTERNAL_ALLOCATION -> ok base=0x..
uvm-free <base>                  UVM_FREE -> ok
managed-mmap <bytes>             PROT_NONE reservation, then mmap(MAP_SHARED|MAP_FIXED) of nvidia-uvm at
                                 offset == address -> ok addr=0x.. len=N
managed-munmap <addr>            munmap a managed-mmap range -> ok
dup <ctl|gpu|uvm>                dup() the fd; later calls use the copy -> ok fd=N orig=M
dup2 <ctl|gpu|uvm> <fd>          dup2() to <fd> -> ok fd=N orig=M
dup3 <ctl|gpu|uvm> <fd>          dup3(O_CLOEXEC) to <fd> -> ok fd=N orig=M
fcntl-dupfd <ctl|gpu|uvm> [min] [cloexec]  fcntl(F_DUPFD[_CLOEXEC]) -> ok fd=N orig=M
close-orig <ctl|gpu|uvm>         close the originals left by dup* -> ok closed=N
close <ctl|gpu|uvm>              close the fd in use (an original, if any, takes over) -> ok fd=N
close-all                        close every device fd without freeing anything -> ok closed=N
fds                              -> ok ctl=N gpu=N uvm=N (-1 when closed)
state                            -> ok client=0x.. device=0x.. subdevice=0x.. gpu=N
pid                              -> ok pid=N
sleep-ms <n>                     -> ok
fork-exit <n>                    fork n children that exit at once (a fork storm) -> ok forked=n
repeat <n> <command...>          run a command n times, answer once -> ok repeat=n <last answer>
exit                             exit(0) at once without freeing or closing anything -> ok bye
bad-null                         RM_ALLOC with a NULL argument -> ok ret=R [errno=E]
bad-unmapped                     RM_ALLOC with an argument at an unmapped address -> ok ret=R [errno=E]
bad-guard                        RM_ALLOC whose struct runs into a PROT_NONE guard page -> ok ret=R [errno=E]
bad-size                         RM_ALLOC with a wrong _IOC_SIZE (40 on a 535+ ABI) -> ok ret=R [errno=E]
bad-unknown                      an unknown escape nr (0x99) -> ok ret=R [errno=E]
bad-nested-null                  RM_ALLOC class 0x40 with pAllocParms=NULL -> ok ret=R status=0x..
bad-race [calls]                 a second thread rewrites the struct and nested params during <calls>
                                 (default 500) RM_ALLOCs -> ok ret=R calls=N nonzero=M
",
    cuda::cuda_help!(),
    "help                             this text (one line: ok followed by the command names)"
);

/// Every command name, in the order of [`HELP`].
pub const COMMANDS: &[&str] = &[
    "init",
    "alloc-rm",
    "alloc-rm21",
    "alloc-vidheap",
    "alloc-memory",
    "dup-object",
    "free",
    "free-vidheap",
    "free-client",
    "control",
    "uvm-map-external",
    "uvm-free",
    "managed-mmap",
    "managed-munmap",
    "dup",
    "dup2",
    "dup3",
    "fcntl-dupfd",
    "close-orig",
    "close",
    "close-all",
    "fds",
    "state",
    "pid",
    "sleep-ms",
    "fork-exit",
    "repeat",
    "exit",
    "bad-null",
    "bad-unmapped",
    "bad-guard",
    "bad-size",
    "bad-unknown",
    "bad-nested-null",
    "bad-race",
    "help",
];
// The `cuda-*` names are in [`cuda::COMMANDS`].

/// The answer to one command: `Ok(payload)` prints `ok payload`, `Err(payload)` prints
/// `err payload`.
pub type Outcome = Result<String, String>;

/// Render an outcome as the protocol line (without newline).
pub fn render(o: &Outcome) -> String {
    let (tag, body) = match o {
        Ok(b) => ("ok", b),
        Err(b) => ("err", b),
    };
    if body.is_empty() { tag.to_string() } else { format!("{tag} {body}") }
}

/// A readable name for common `NV_STATUS` values.
pub fn status_name(s: u32) -> &'static str {
    match s {
        nv::NV_OK => "NV_OK",
        nv::NV_ERR_GENERIC => "NV_ERR_GENERIC",
        nv::NV_ERR_INSERT_DUPLICATE_NAME => "NV_ERR_INSERT_DUPLICATE_NAME",
        nv::NV_ERR_INVALID_ADDRESS => "NV_ERR_INVALID_ADDRESS",
        nv::NV_ERR_INVALID_ARGUMENT => "NV_ERR_INVALID_ARGUMENT",
        nv::NV_ERR_INVALID_CLASS => "NV_ERR_INVALID_CLASS",
        nv::NV_ERR_INVALID_CLIENT => "NV_ERR_INVALID_CLIENT",
        nv::NV_ERR_INVALID_FUNCTION => "NV_ERR_INVALID_FUNCTION",
        nv::NV_ERR_INVALID_LIMIT => "NV_ERR_INVALID_LIMIT",
        nv::NV_ERR_INVALID_OBJECT_HANDLE => "NV_ERR_INVALID_OBJECT_HANDLE",
        nv::NV_ERR_INVALID_OBJECT_NEW => "NV_ERR_INVALID_OBJECT_NEW",
        nv::NV_ERR_INVALID_OBJECT_PARENT => "NV_ERR_INVALID_OBJECT_PARENT",
        nv::NV_ERR_INVALID_POINTER => "NV_ERR_INVALID_POINTER",
        nv::NV_ERR_NO_MEMORY => "NV_ERR_NO_MEMORY",
        nv::NV_ERR_NOT_SUPPORTED => "NV_ERR_NOT_SUPPORTED",
        nv::NV_ERR_OBJECT_NOT_FOUND => "NV_ERR_OBJECT_NOT_FOUND",
        _ => "unknown",
    }
}

/// Parse a number: decimal or `0x` hex.
pub fn parse_number(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Parse a size: a number with an optional binary suffix (`K`, `M`, `G`, `T`, optionally `iB`/`B`).
pub fn parse_bytes(s: &str) -> Option<u64> {
    let lower = s.trim().to_ascii_lowercase();
    if let Some(v) = parse_number(&lower) {
        return Some(v);
    }
    let body = lower.strip_suffix("ib").or_else(|| lower.strip_suffix('b')).unwrap_or(&lower);
    let shift = match body.as_bytes().last()? {
        b'k' => 10,
        b'm' => 20,
        b'g' => 30,
        b't' => 40,
        _ => return None,
    };
    parse_number(&body[..body.len() - 1])?.checked_mul(1u64 << shift)
}

/// Which of the workload's device fds a command names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FdName {
    Ctl,
    Gpu,
    Uvm,
}

impl FdName {
    fn parse(s: Option<&&str>) -> Result<Self, String> {
        match s.copied() {
            Some("ctl") => Ok(FdName::Ctl),
            Some("gpu") => Ok(FdName::Gpu),
            Some("uvm") => Ok(FdName::Uvm),
            other => Err(format!("usage: expected ctl|gpu|uvm, got {}", other.unwrap_or("nothing"))),
        }
    }
}

/// One named fd: the one in use plus any originals left by `dup*`.
#[derive(Debug, Default)]
struct FdSlot {
    current: Option<OwnedFd>,
    originals: Vec<OwnedFd>,
}

/// Options for a [`CudaLikeClient`].
#[derive(Clone, Debug)]
pub struct WorkloadOptions {
    /// Directory holding `nvidiactl`, `nvidiaN`, `nvidia-uvm`.
    pub dev_dir: PathBuf,
    /// Driver version whose struct layouts (and version string) to use.
    pub driver_version: DriverVersion,
}

impl Default for WorkloadOptions {
    fn default() -> Self {
        Self { dev_dir: "/dev".into(), driver_version: nv::DEFAULT_DRIVER_VERSION }
    }
}

/// The state of the simulated CUDA process and the command interpreter.
#[derive(Debug)]
pub struct CudaLikeClient {
    opts: WorkloadOptions,
    abi: DriverAbi,
    fds: BTreeMap<FdName, FdSlot>,
    client: u32,
    device: u32,
    subdevice: u32,
    gpu: u32,
    gpu_uuid: [u8; 16],
    /// Managed mmaps: address -> length.
    managed: BTreeMap<u64, usize>,
    /// UVM external ranges: base -> length.
    external: BTreeMap<u64, u64>,
    /// The CUDA driver library the `cuda-*` commands call, once loaded.
    cuda: Option<cuda::CudaSession>,
    exit_requested: bool,
}

type Step = Result<(), String>;

impl CudaLikeClient {
    /// A client that has opened nothing yet.
    pub fn new(opts: WorkloadOptions) -> Self {
        Self {
            abi: DriverAbi::for_version(opts.driver_version),
            opts,
            fds: BTreeMap::new(),
            client: 0,
            device: 0,
            subdevice: 0,
            gpu: 0,
            gpu_uuid: [0; 16],
            managed: BTreeMap::new(),
            external: BTreeMap::new(),
            cuda: None,
            exit_requested: false,
        }
    }

    /// `dlopen` the CUDA driver library at `path` for the `cuda-*` commands.
    pub fn load_libcuda(&mut self, path: &std::path::Path) -> Result<(), String> {
        self.cuda = Some(cuda::CudaSession::open(path)?);
        Ok(())
    }

    /// Whether the last command was `exit`.
    pub fn exit_requested(&self) -> bool {
        self.exit_requested
    }

    /// Run one command line and produce its answer.
    pub fn execute(&mut self, line: &str) -> Outcome {
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some((&cmd, args)) = words.split_first() else { return Err("usage: empty command".into()) };
        let bytes = |i: usize| -> Result<u64, String> {
            args.get(i).and_then(|s| parse_bytes(s)).ok_or_else(|| format!("usage: {cmd}: expected a size"))
        };
        let handle = |i: usize| -> Result<u32, String> {
            args.get(i)
                .and_then(|s| parse_number(s))
                .and_then(|v| u32::try_from(v).ok())
                .ok_or_else(|| format!("usage: {cmd}: expected a handle"))
        };
        let number = |i: usize| -> Result<u64, String> {
            args.get(i).and_then(|s| parse_number(s)).ok_or_else(|| format!("usage: {cmd}: expected a number"))
        };
        let location = |i: usize| -> Result<MemLocation, String> {
            match args.get(i).copied() {
                None | Some("vidmem") => Ok(MemLocation::Vidmem),
                Some("sysmem") => Ok(MemLocation::Sysmem),
                Some(o) => Err(format!("usage: {cmd}: expected vidmem|sysmem, got {o}")),
            }
        };
        match cmd {
            "init" => self.init(u32::try_from(number(0)?).map_err(|_| "usage: init <gpu>".to_string())?),
            "alloc-rm" => self.alloc_rm(bytes(0)?, location(1)?, false),
            "alloc-rm21" => self.alloc_rm(bytes(0)?, location(1)?, true),
            "alloc-vidheap" => self.alloc_vidheap(bytes(0)?, location(1)?),
            "alloc-memory" => self.alloc_memory(bytes(0)?, location(1)?),
            "dup-object" => self.dup_object(handle(0)?),
            "free" => self.free(handle(0)?),
            "free-vidheap" => self.free_vidheap(handle(0)?),
            "free-client" => self.free_client(),
            "control" => self.attached_ids(),
            "uvm-map-external" => self.uvm_map_external(handle(0)?, bytes(1)?),
            "uvm-free" => self.uvm_free(number(0)?),
            "managed-mmap" => self.managed_mmap(bytes(0)?),
            "managed-munmap" => self.managed_munmap(number(0)?),
            "dup" => self.dup(FdName::parse(args.first())?, DupKind::Dup),
            "dup2" => self.dup(FdName::parse(args.first())?, DupKind::Dup2(target_fd(number(1)?)?)),
            "dup3" => self.dup(FdName::parse(args.first())?, DupKind::Dup3(target_fd(number(1)?)?)),
            "fcntl-dupfd" => {
                let min = if args.len() > 1 { target_fd(number(1)?)? } else { 0 };
                self.dup(FdName::parse(args.first())?, DupKind::Fcntl { min, cloexec: args.get(2) == Some(&"cloexec") })
            }
            "close-orig" => self.close_orig(FdName::parse(args.first())?),
            "close" => self.close(FdName::parse(args.first())?),
            "close-all" => Ok(format!("closed={}", self.close_all())),
            "fds" => Ok(format!(
                "ctl={} gpu={} uvm={}",
                self.raw(FdName::Ctl).unwrap_or(-1),
                self.raw(FdName::Gpu).unwrap_or(-1),
                self.raw(FdName::Uvm).unwrap_or(-1)
            )),
            "state" => Ok(format!(
                "client={:#x} device={:#x} subdevice={:#x} gpu={}",
                self.client, self.device, self.subdevice, self.gpu
            )),
            "pid" => Ok(format!("pid={}", std::process::id())),
            "sleep-ms" => {
                std::thread::sleep(Duration::from_millis(number(0)?));
                Ok(String::new())
            }
            "fork-exit" => sys::fork_exit(number(0)?).map(|n| format!("forked={n}")),
            "repeat" => {
                let n = number(0)?;
                let inner = words.get(2..).filter(|w| !w.is_empty()).ok_or("usage: repeat <n> <command...>")?.join(" ");
                if inner.starts_with("exit") || inner.starts_with("repeat") {
                    return Err("usage: repeat cannot run exit or repeat".into());
                }
                let mut last = String::new();
                for i in 0..n {
                    last = self.execute(&inner).map_err(|e| format!("repeat-failed-at={i} {e}"))?;
                }
                Ok(format!("repeat={n} {last}").trim_end().to_string())
            }
            "exit" => {
                self.exit_requested = true;
                Ok("bye".into())
            }
            "bad-null" => self.bad_alloc_at(0),
            "bad-unmapped" => self.bad_unmapped(),
            "bad-guard" => self.bad_guard(),
            "bad-size" => self.bad_size(),
            "bad-unknown" => self.bad_unknown(),
            "bad-nested-null" => self.bad_nested_null(),
            "bad-race" => self.bad_race(if args.is_empty() { 500 } else { number(0)? }),
            "help" => Ok(COMMANDS.iter().chain(cuda::COMMANDS).copied().collect::<Vec<_>>().join(" ")),
            c if cuda::COMMANDS.contains(&c) => match self.cuda.as_mut() {
                Some(session) => session.execute(c, args),
                None => Err("state: no libcuda loaded (start nv-workload with --libcuda PATH)".into()),
            },
            other => Err(format!("usage: unknown command {other}")),
        }
    }

    // ----- fds ------------------------------------------------------------------------------------

    fn raw(&self, name: FdName) -> Option<RawFd> {
        self.fds.get(&name)?.current.as_ref().map(AsRawFd::as_raw_fd)
    }

    fn need(&self, name: FdName) -> Result<RawFd, String> {
        self.raw(name).ok_or_else(|| format!("state: no {name:?} fd open (run init)").to_lowercase())
    }

    fn need_client(&self) -> Result<RawFd, String> {
        let fd = self.need(FdName::Ctl)?;
        if self.client == 0 || self.device == 0 {
            return Err("state: no client/device (run init)".into());
        }
        Ok(fd)
    }

    fn open(&mut self, name: FdName, file: &str) -> Result<RawFd, String> {
        let path = self.opts.dev_dir.join(file);
        let fd = sys::open_device(&path).map_err(|e| format!("op=open errno={} path={}", errno(&e), path.display()))?;
        let raw = fd.as_raw_fd();
        let slot = self.fds.entry(name).or_default();
        if let Some(old) = slot.current.replace(fd) {
            slot.originals.push(old);
        }
        Ok(raw)
    }

    fn all_fds(&self) -> impl Iterator<Item = RawFd> + '_ {
        self.fds.values().flat_map(|s| s.current.iter().chain(s.originals.iter())).map(AsRawFd::as_raw_fd)
    }

    fn dup(&mut self, name: FdName, kind: DupKind) -> Outcome {
        let held: Vec<RawFd> = self.all_fds().collect();
        let slot = self.fds.get_mut(&name).ok_or("state: fd not open")?;
        let cur = slot.current.as_ref().ok_or("state: fd not open")?;
        let new = match kind {
            DupKind::Dup => sys::dup(cur),
            DupKind::Dup2(t) | DupKind::Dup3(t) if held.contains(&t) => {
                return Err(format!("usage: fd {t} is in use by the workload"));
            }
            DupKind::Dup2(t) => sys::dup_to(cur, t, false),
            DupKind::Dup3(t) => sys::dup_to(cur, t, true),
            DupKind::Fcntl { min, cloexec } => sys::fcntl_dupfd(cur, min, cloexec),
        }
        .map_err(|e| format!("op=dup errno={}", errno(&e)))?;
        let (new_raw, orig_raw) = (new.as_raw_fd(), cur.as_raw_fd());
        let old = slot.current.replace(new).expect("checked above");
        slot.originals.push(old);
        Ok(format!("fd={new_raw} orig={orig_raw}"))
    }

    fn close_orig(&mut self, name: FdName) -> Outcome {
        let slot = self.fds.get_mut(&name).ok_or("state: fd not open")?;
        let n = slot.originals.len();
        slot.originals.clear();
        Ok(format!("closed={n}"))
    }

    fn close(&mut self, name: FdName) -> Outcome {
        let slot = self.fds.get_mut(&name).ok_or("state: fd not open")?;
        let fd = slot.current.take().ok_or("state: fd not open")?;
        let raw = fd.as_raw_fd();
        drop(fd);
        slot.current = slot.originals.pop();
        Ok(format!("fd={raw}"))
    }

    /// Close every device fd without freeing anything; the driver frees the clients when the
    /// files are released. Managed mappings stay (and keep `nvidia-uvm` open until unmapped).
    pub fn close_all(&mut self) -> usize {
        let n = self.all_fds().count();
        self.fds.clear();
        self.client = 0;
        self.device = 0;
        self.subdevice = 0;
        n
    }

    // ----- ioctl helpers --------------------------------------------------------------------------

    /// A frontend escape `_IOWR('F', nr, buf.len())`; checks the errno and, if `status_off` is
    /// given, the RM status.
    fn frontend(&self, fd: RawFd, nr: u32, buf: &mut [u8], status_off: Option<usize>, op: &str) -> Step {
        let cmd = nv::iowr(nr, buf.len() as u32);
        // SAFETY: `buf` is a live, exclusively borrowed buffer of exactly `_IOC_SIZE(cmd)` bytes.
        unsafe { sys::ioctl(fd, cmd, buf.as_mut_ptr().cast()) }.map_err(|e| format!("op={op} errno={}", errno(&e)))?;
        check_status(buf, status_off, op)
    }

    /// A UVM command (plain integer); checks the errno and the `rmStatus` at `status_off`.
    fn uvm_call(&self, cmd: u32, buf: &mut [u8], status_off: usize, op: &str) -> Step {
        let fd = self.need(FdName::Uvm)?;
        // SAFETY: `buf` is a live, exclusively borrowed buffer of the struct's size.
        unsafe { sys::ioctl(fd, cmd, buf.as_mut_ptr().cast()) }.map_err(|e| format!("op={op} errno={}", errno(&e)))?;
        check_status(buf, Some(status_off), op)
    }

    /// RM_ALLOC through the NVOS64 form (or NVOS21 when `short`); returns the new handle.
    fn rm_alloc(
        &self,
        fd: RawFd,
        mut a: RmAllocArgs,
        params: Option<&mut [u8]>,
        short: bool,
        op: &str,
    ) -> Result<u32, String> {
        if let Some(p) = params {
            a.p_alloc_params = p.as_mut_ptr() as u64;
        }
        if short {
            let mut b = encode::nvos21(&a);
            self.frontend(fd, esc::RM_ALLOC, &mut b, Some(off::NVOS21_STATUS), op)?;
            Ok(u32_at(&b, off::ALLOC_H_NEW))
        } else {
            let mut b = encode::nvos64(&a, &self.abi);
            self.frontend(fd, esc::RM_ALLOC, &mut b, Some(self.abi.nvos64_status), op)?;
            Ok(u32_at(&b, off::ALLOC_H_NEW))
        }
    }

    fn control(&self, fd: RawFd, h_object: u32, cmd: u32, params: &mut [u8], op: &str) -> Step {
        let mut b = encode::nvos54(self.client, h_object, cmd, params.as_mut_ptr() as u64, params.len() as u32);
        self.frontend(fd, esc::RM_CONTROL, &mut b, Some(off::CTRL_STATUS), op)
    }

    // ----- commands -------------------------------------------------------------------------------

    fn init(&mut self, gpu: u32) -> Outcome {
        if self.raw(FdName::Ctl).is_some() {
            return Err("state: already initialized (close-all first)".into());
        }
        let ctl = self.open(FdName::Ctl, "nvidiactl")?;

        let mut v = encode::rm_api_version(nv::NV_RM_API_VERSION_CMD_STRICT, &version_string(self.opts.driver_version));
        self.frontend(ctl, esc::CHECK_VERSION_STR, &mut v, None, "CHECK_VERSION_STR")?;
        if u32_at(&v, off::RM_API_VERSION_REPLY) != nv::NV_RM_API_VERSION_REPLY_RECOGNIZED {
            return Err("op=CHECK_VERSION_STR reply=unrecognized".into());
        }

        let mut cards = vec![0u8; (size::CARD_INFO_ENTRY * crate::fake_driver::rm::NV_MAX_DEVICES) as usize];
        self.frontend(ctl, esc::CARD_INFO, &mut cards, None, "CARD_INFO")?;
        let present = cards
            .chunks(size::CARD_INFO_ENTRY as usize)
            .any(|e| e[off::CARD_INFO_VALID] != 0 && u32_at(e, off::CARD_INFO_MINOR_NUMBER) == gpu);
        if !present {
            return Err(format!("op=CARD_INFO gpu={gpu} missing"));
        }

        let client = self.rm_alloc(
            ctl,
            RmAllocArgs { h_class: class::NV01_ROOT_CLIENT, ..Default::default() },
            None,
            false,
            "RM_ALLOC",
        )?;
        self.client = client;
        self.gpu = gpu;

        let gpu_fd = self.open(FdName::Gpu, &format!("nvidia{gpu}"))?;
        let mut r = encode::register_fd(ctl);
        self.frontend(gpu_fd, esc::REGISTER_FD, &mut r, None, "REGISTER_FD")?;

        let mut p0080 = encode::nv0080_alloc_params(gpu);
        let device = self.rm_alloc(
            ctl,
            RmAllocArgs {
                h_root: client,
                h_parent: client,
                h_class: class::NV01_DEVICE_0,
                params_size: size::NV0080_ALLOC_PARAMETERS,
                ..Default::default()
            },
            Some(&mut p0080),
            false,
            "RM_ALLOC",
        )?;
        self.device = device;
        let mut p2080 = encode::nv2080_alloc_params(0);
        let subdevice = self.rm_alloc(
            ctl,
            RmAllocArgs {
                h_root: client,
                h_parent: device,
                h_class: class::NV20_SUBDEVICE_0,
                params_size: size::NV2080_ALLOC_PARAMETERS,
                ..Default::default()
            },
            Some(&mut p2080),
            false,
            "RM_ALLOC",
        )?;
        self.subdevice = subdevice;

        // What libcuda asks right after: attached GPU ids, their instance, the GPU UUID.
        let mut ids = [0u8; 128];
        self.control(ctl, client, ctrl::NV0000_CTRL_CMD_GPU_GET_ATTACHED_IDS, &mut ids, "RM_CONTROL")?;
        let mut info = [0u8; size::NV0000_CTRL_GPU_GET_ID_INFO_V2 as usize];
        put_u32(&mut info, off::GET_ID_INFO_V2_GPU_ID, (gpu + 1) << 8);
        self.control(ctl, client, ctrl::NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2, &mut info, "RM_CONTROL")?;
        let mut gid = encode::get_gid_info();
        self.control(ctl, subdevice, ctrl::NV2080_CTRL_CMD_GPU_GET_GID_INFO, &mut gid, "RM_CONTROL")?;
        self.gpu_uuid = gpu_uuid(&gid, gpu);

        self.open(FdName::Uvm, "nvidia-uvm")?;
        let mut init = encode::uvm_initialize(0);
        self.uvm_call(uvm::INITIALIZE, &mut init, uvm::INITIALIZE_STATUS, "UVM_INITIALIZE")?;
        let mut reg = encode::uvm_register_gpu(&self.gpu_uuid, ctl, client);
        self.uvm_call(uvm::REGISTER_GPU, &mut reg, uvm::REGISTER_GPU_STATUS, "UVM_REGISTER_GPU")?;

        Ok(format!("client={client:#x} device={device:#x} subdevice={subdevice:#x}"))
    }

    fn attached_ids(&mut self) -> Outcome {
        let ctl = self.need_client()?;
        let mut ids = [0u8; 128];
        self.control(ctl, self.client, ctrl::NV0000_CTRL_CMD_GPU_GET_ATTACHED_IDS, &mut ids, "RM_CONTROL")?;
        Ok(String::new())
    }

    fn alloc_rm(&mut self, bytes: u64, loc: MemLocation, short: bool) -> Outcome {
        let ctl = self.need_client()?;
        let mut params = encode::memory_allocation_params(bytes, loc, self.client);
        let args = RmAllocArgs {
            h_root: self.client,
            h_parent: self.device,
            h_class: loc.class(),
            params_size: self.abi.mem_alloc_params_size,
            ..Default::default()
        };
        let h = self.rm_alloc(ctl, args, Some(&mut params), short, "RM_ALLOC")?;
        Ok(format!("handle={h:#x}"))
    }

    fn alloc_vidheap(&mut self, bytes: u64, loc: MemLocation) -> Outcome {
        let ctl = self.need_client()?;
        let mut b = encode::nvos32_alloc_size(self.client, self.device, bytes, loc, 0);
        self.frontend(ctl, esc::RM_VID_HEAP_CONTROL, &mut b, Some(off::VHC_STATUS), "RM_VID_HEAP_CONTROL")?;
        Ok(format!("handle={:#x}", u32_at(&b, off::VHC_H_MEMORY)))
    }

    fn alloc_memory(&mut self, bytes: u64, loc: MemLocation) -> Outcome {
        self.need_client()?;
        let gpu_fd = self.need(FdName::Gpu)?;
        if bytes == 0 {
            return Err("usage: alloc-memory: size must be > 0".into());
        }
        let mut b = vec![0u8; size::NVOS02_WITH_FD as usize];
        put_u32(&mut b, off::NVOS02_H_ROOT, self.client);
        put_u32(&mut b, off::NVOS02_H_PARENT, self.device);
        put_u32(&mut b, off::NVOS02_H_NEW, 0);
        put_u32(&mut b, off::NVOS02_H_CLASS, loc.class());
        let location = match loc {
            MemLocation::Vidmem => nv::NVOS02_LOCATION_VIDMEM,
            MemLocation::Sysmem => nv::NVOS02_LOCATION_PCI,
        };
        put_u32(&mut b, off::NVOS02_FLAGS, location << nv::NVOS02_LOCATION_SHIFT);
        put_u64(&mut b, off::NVOS02_LIMIT, bytes - 1);
        put_u32(&mut b, off::NVOS02_FD, gpu_fd as u32);
        self.frontend(gpu_fd, esc::RM_ALLOC_MEMORY, &mut b, Some(off::NVOS02_STATUS), "RM_ALLOC_MEMORY")?;
        Ok(format!("handle={:#x}", u32_at(&b, off::NVOS02_H_NEW)))
    }

    fn dup_object(&mut self, h: u32) -> Outcome {
        let ctl = self.need_client()?;
        let mut b = vec![0u8; size::NVOS55 as usize];
        put_u32(&mut b, off::DUP_H_CLIENT, self.client);
        put_u32(&mut b, off::DUP_H_PARENT, self.device);
        put_u32(&mut b, off::DUP_H_OBJECT, 0);
        put_u32(&mut b, off::DUP_H_CLIENT_SRC, self.client);
        put_u32(&mut b, off::DUP_H_OBJECT_SRC, h);
        self.frontend(ctl, esc::RM_DUP_OBJECT, &mut b, Some(off::DUP_STATUS), "RM_DUP_OBJECT")?;
        Ok(format!("handle={:#x}", u32_at(&b, off::DUP_H_OBJECT)))
    }

    fn free(&mut self, h: u32) -> Outcome {
        let ctl = self.need(FdName::Ctl)?;
        let parent = if h == self.device || h == self.client { self.client } else { self.device };
        let mut b = encode::nvos00(self.client, parent, h);
        self.frontend(ctl, esc::RM_FREE, &mut b, Some(off::FREE_STATUS), "RM_FREE")?;
        if h == self.client {
            (self.client, self.device, self.subdevice) = (0, 0, 0);
        } else if h == self.device {
            (self.device, self.subdevice) = (0, 0);
        }
        Ok(String::new())
    }

    fn free_vidheap(&mut self, h: u32) -> Outcome {
        let ctl = self.need_client()?;
        let mut b = encode::nvos32_free(self.client, self.device, h);
        self.frontend(ctl, esc::RM_VID_HEAP_CONTROL, &mut b, Some(off::VHC_STATUS), "RM_VID_HEAP_CONTROL")?;
        Ok(String::new())
    }

    fn free_client(&mut self) -> Outcome {
        if self.client == 0 {
            return Err("state: no client (run init)".into());
        }
        self.free(self.client)
    }

    fn uvm_map_external(&mut self, h: u32, bytes: u64) -> Outcome {
        let ctl = self.need_client()?;
        self.need(FdName::Uvm)?;
        const ALIGN: u64 = 2 << 20;
        let length = bytes.div_ceil(ALIGN).max(1) * ALIGN;
        // Reserve GPU VA in the CPU address space, as CUDA does, and keep it for the process's life.
        let res = sys::AnonMapping::new((length + ALIGN) as usize, libc::PROT_NONE)
            .map_err(|e| format!("op=mmap errno={}", errno(&e)))?;
        let (res_addr, _) = res.leak();
        let base = res_addr.div_ceil(ALIGN) * ALIGN;
        let mut range = encode::uvm_create_external_range(base, length);
        self.uvm_call(
            uvm::CREATE_EXTERNAL_RANGE,
            &mut range,
            uvm::CREATE_EXTERNAL_RANGE_STATUS,
            "UVM_CREATE_EXTERNAL_RANGE",
        )?;
        let mut map = encode::uvm_map_external_allocation(&self.abi, base, length, &self.gpu_uuid, ctl, self.client, h);
        let st = encode::uvm_map_external_status_offset(&self.abi);
        self.uvm_call(uvm::MAP_EXTERNAL_ALLOCATION, &mut map, st, "UVM_MAP_EXTERNAL_ALLOCATION")?;
        self.external.insert(base, length);
        Ok(format!("base={base:#x} length={length}"))
    }

    fn uvm_free(&mut self, base: u64) -> Outcome {
        let length = self.external.get(&base).copied().unwrap_or(0);
        let mut b = encode::uvm_free(&self.abi, base, length);
        let st = self.abi.uvm_free_status;
        self.uvm_call(uvm::FREE, &mut b, st, "UVM_FREE")?;
        self.external.remove(&base);
        Ok(String::new())
    }

    fn managed_mmap(&mut self, bytes: u64) -> Outcome {
        if bytes == 0 {
            return Err("usage: managed-mmap: size must be > 0".into());
        }
        let len = sys::page_round_up(bytes) as usize;
        let slot =
            self.fds.get(&FdName::Uvm).and_then(|s| s.current.as_ref()).ok_or("state: no uvm fd open (run init)")?;
        let res = sys::AnonMapping::new(len, libc::PROT_NONE).map_err(|e| format!("op=mmap errno={}", errno(&e)))?;
        let addr = res.addr();
        // SAFETY: the range is our own PROT_NONE reservation, which nothing references.
        let mapped = unsafe { sys::mmap_shared_fixed(addr, len, slot, addr) };
        match mapped {
            Ok(a) => {
                // The reservation is now the UVM mapping; do not unmap it on drop.
                res.leak();
                self.managed.insert(a, len);
                Ok(format!("addr={a:#x} len={len}"))
            }
            Err(e) => Err(format!("op=mmap errno={}", errno(&e))),
        }
    }

    fn managed_munmap(&mut self, addr: u64) -> Outcome {
        let len = *self.managed.get(&addr).ok_or_else(|| format!("state: no managed mapping at {addr:#x}"))?;
        // SAFETY: the range is a managed mapping this workload created and nothing references.
        unsafe { sys::munmap(addr, len) }.map_err(|e| format!("op=munmap errno={}", errno(&e)))?;
        self.managed.remove(&addr);
        Ok(String::new())
    }

    // ----- bad inputs -----------------------------------------------------------------------------
    //
    // Each makes one ioctl the tracer must survive and answers `ok` with its return value.

    fn bad_alloc_at(&self, arg: u64) -> Outcome {
        let ctl = self.need(FdName::Ctl)?;
        let cmd = nv::iowr(esc::RM_ALLOC, self.abi.nvos64_size);
        // SAFETY: a deliberately invalid pointer; the kernel validates it and fails the copy.
        Ok(ret_text(unsafe { sys::ioctl(ctl, cmd, arg as usize as *mut libc::c_void) }))
    }

    fn bad_unmapped(&self) -> Outcome {
        let page = sys::page_size();
        let addr = sys::AnonMapping::new(page, libc::PROT_READ | libc::PROT_WRITE)
            .map_err(|e| format!("op=mmap errno={}", errno(&e)))?
            .addr();
        // The mapping was dropped (unmapped) above: `addr` now points at nothing.
        self.bad_alloc_at(addr)
    }

    fn bad_guard(&self) -> Outcome {
        let ctl = self.need(FdName::Ctl)?;
        let page = sys::page_size();
        let m = sys::AnonMapping::new(2 * page, libc::PROT_READ | libc::PROT_WRITE)
            .map_err(|e| format!("op=mmap errno={}", errno(&e)))?;
        m.protect(page, page, libc::PROT_NONE).map_err(|e| format!("op=mprotect errno={}", errno(&e)))?;
        // The struct starts 24 bytes before the guard page: its header is readable, the rest is not.
        let head = encode::nvos64(
            &RmAllocArgs {
                h_root: self.client,
                h_parent: self.device,
                h_class: class::NV01_MEMORY_LOCAL_USER,
                ..Default::default()
            },
            &self.abi,
        );
        let start = page - 24;
        // SAFETY: [start, start + 24) lies in the readable first page of our own mapping.
        unsafe { std::ptr::copy_nonoverlapping(head.as_ptr(), m.ptr().add(start), 24) };
        let cmd = nv::iowr(esc::RM_ALLOC, self.abi.nvos64_size);
        // SAFETY: the kernel validates the user range and fails the copy at the guard page.
        let r = unsafe { sys::ioctl(ctl, cmd, m.ptr().add(start).cast()) };
        Ok(ret_text(r))
    }

    fn bad_size(&self) -> Outcome {
        let ctl = self.need(FdName::Ctl)?;
        // 40 bytes is the pre-535 NVOS64 size; on older ABIs use 48, which is wrong there.
        let wrong = if self.abi.nvos64_size == size::NVOS64 { size::NVOS64_PRE535 } else { size::NVOS64 };
        let mut b = encode::nvos64(
            &RmAllocArgs {
                h_root: self.client,
                h_parent: self.device,
                h_class: class::NV01_DEVICE_0,
                ..Default::default()
            },
            &self.abi,
        );
        b.resize(size::NVOS64 as usize, 0);
        // SAFETY: `b` is 48 bytes, at least as large as either size the kernel may copy.
        Ok(ret_text(unsafe { sys::ioctl(ctl, nv::iowr(esc::RM_ALLOC, wrong), b.as_mut_ptr().cast()) }))
    }

    fn bad_unknown(&self) -> Outcome {
        let ctl = self.need(FdName::Ctl)?;
        let mut b = [0u8; 16];
        // SAFETY: `b` is exactly `_IOC_SIZE` (16) bytes.
        Ok(ret_text(unsafe { sys::ioctl(ctl, nv::iowr(BAD_UNKNOWN_NR, 16), b.as_mut_ptr().cast()) }))
    }

    fn bad_nested_null(&self) -> Outcome {
        let ctl = self.need_client()?;
        let mut b = encode::nvos64(
            &RmAllocArgs {
                h_root: self.client,
                h_parent: self.device,
                h_class: class::NV01_MEMORY_LOCAL_USER,
                p_alloc_params: 0,
                params_size: self.abi.mem_alloc_params_size,
                ..Default::default()
            },
            &self.abi,
        );
        let cmd = nv::iowr(esc::RM_ALLOC, b.len() as u32);
        // SAFETY: `b` is exactly `_IOC_SIZE` bytes; the NULL nested pointer is the driver's problem.
        let r = unsafe { sys::ioctl(ctl, cmd, b.as_mut_ptr().cast()) };
        Ok(format!("{} status={:#x}", ret_text(r), u32_at(&b, self.abi.nvos64_status)))
    }

    fn bad_race(&self, calls: u64) -> Outcome {
        let ctl = self.need_client()?;
        let shared = Arc::new(RaceBuffers::default());
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (shared, stop) = (shared.clone(), stop.clone());
            let nested_ptr = shared.nested.as_ptr() as u64;
            let alloc_ptr = shared.alloc.as_ptr() as u64;
            std::thread::spawn(move || {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(std::process::id());
                let pointers = [nested_ptr, 0, 0xdead_0000, 0xffff_8880_0000_0000, alloc_ptr, nested_ptr + 4000];
                while !stop.load(Ordering::Relaxed) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let word = (x >> 8) as usize % shared.alloc.len();
                    let v = if word == 2 { pointers[(x >> 20) as usize % pointers.len()] } else { x.rotate_left(17) };
                    shared.alloc[word].store(v, Ordering::Relaxed);
                    shared.nested[(x >> 40) as usize % shared.nested.len()].store(x, Ordering::Relaxed);
                }
            })
        };
        let cmd = nv::iowr(esc::RM_ALLOC, self.abi.nvos64_size);
        let (mut last, mut nonzero) = (0i32, 0u64);
        for i in 0..calls {
            shared.reset(self, i);
            // SAFETY: the kernel reads and writes the atomics' bytes; the other thread only uses
            // atomic stores, so there is no non-atomic Rust access to race with.
            let r = unsafe { libc::ioctl(ctl, cmd as libc::c_ulong, shared.alloc.as_ptr() as *mut libc::c_void) };
            last = r;
            if r != 0 {
                nonzero += 1;
            }
        }
        stop.store(true, Ordering::Relaxed);
        let _ = writer.join();
        Ok(format!("ret={last} calls={calls} nonzero={nonzero}"))
    }
}

/// The escape nr `bad-unknown` uses: between the RM escapes (<= 0x5f) and the frontend ones (>= 200).
pub const BAD_UNKNOWN_NR: u32 = 0x99;

enum DupKind {
    Dup,
    Dup2(RawFd),
    Dup3(RawFd),
    Fcntl { min: RawFd, cloexec: bool },
}

fn target_fd(v: u64) -> Result<RawFd, String> {
    RawFd::try_from(v).map_err(|_| "usage: fd out of range".to_string())
}

fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

fn ret_text(r: std::io::Result<i32>) -> String {
    match r {
        Ok(v) => format!("ret={v}"),
        Err(e) => format!("ret=-1 errno={}", errno(&e)),
    }
}

fn check_status(buf: &[u8], status_off: Option<usize>, op: &str) -> Step {
    match status_off.map(|o| u32_at(buf, o)) {
        Some(st) if st != nv::NV_OK => Err(format!("op={op} status={st:#x} name={}", status_name(st))),
        _ => Ok(()),
    }
}

/// The GPU UUID from GET_GID_INFO, or (when the driver filled nothing in, as the fake does) a
/// stable made-up one.
fn gpu_uuid(gid: &[u8], gpu: u32) -> [u8; 16] {
    let mut u = [0u8; 16];
    let data = &gid[off::GET_GID_INFO_DATA..off::GET_GID_INFO_DATA + 16];
    if u32_at(gid, off::GET_GID_INFO_LENGTH) == 16 && data.iter().any(|&b| b != 0) {
        u.copy_from_slice(data);
    } else {
        u[..4].copy_from_slice(b"FAKE");
        u[12..].copy_from_slice(&gpu.to_be_bytes());
    }
    u
}

/// The parameter struct and nested params `bad-race` shares with its writer thread, as atomics so
/// that concurrent writes are defined behaviour on the Rust side.
#[derive(Default)]
struct RaceBuffers {
    alloc: [AtomicU64; 6],
    nested: [AtomicU64; 16],
}

impl RaceBuffers {
    fn reset(&self, c: &CudaLikeClient, n: u64) {
        let lo_hi = |lo: u32, hi: u32| u64::from(lo) | (u64::from(hi) << 32);
        self.alloc[0].store(lo_hi(c.client, c.device), Ordering::Relaxed);
        self.alloc[1].store(lo_hi(0, class::NV01_MEMORY_LOCAL_USER), Ordering::Relaxed);
        self.alloc[2].store(self.nested.as_ptr() as u64, Ordering::Relaxed);
        self.alloc[3].store(0, Ordering::Relaxed);
        self.alloc[4].store(lo_hi(c.abi.mem_alloc_params_size, 0), Ordering::Relaxed);
        self.alloc[5].store(0, Ordering::Relaxed);
        // NV_MEMORY_ALLOCATION_PARAMS.size (@64 = word 8): small, so successful calls stay cheap.
        self.nested[8].store(4096 * (1 + n % 4), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests;
