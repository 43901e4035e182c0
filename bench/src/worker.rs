//! The measured workload, run as a child process (`gpu-tracer-bench __worker ...`).
//!
//! It must be a separate process: the agent never tracks opens made by its own process
//! (`TracerConfig::agent_tgid`), and a separate process also keeps the agent's consumer thread off
//! the measured CPU. Results go to stdout, one `key value...` line each.
use std::{ffi::CString, hint::black_box, time::Instant};

use anyhow::{Context, Result, bail};
use tracer_common::nv;

use gpu_tracer_tests::workload::cuda::Launcher;

use crate::sys;

/// `ioctl(2)` command of RM_ALLOC with the 48-byte `NVOS64_PARAMETERS` (0xC030462B).
pub const RM_ALLOC_NVOS64: u32 = nv::iowr(nv::esc::RM_ALLOC, nv::size::NVOS64);
const _: () = assert!(RM_ALLOC_NVOS64 == 0xC030_462B);

/// An escape the tracer has no capture plan for, with `_IOC_SIZE` 0: recorded, nothing copied.
pub const BARE_CMD: u32 = nv::iowr(0x99, 0);

/// `NVOS64_PARAMETERS` (535.43.02+ layout, 48 bytes).
#[repr(C)]
struct Nvos64 {
    h_root: u32,
    h_object_parent: u32,
    h_object_new: u32,
    h_class: u32,
    p_alloc_parms: u64,
    p_rights_requested: u64,
    params_size: u32,
    flags: u32,
    status: u32,
    _pad: u32,
}
const _: () = assert!(size_of::<Nvos64>() == 48);

/// A 128-byte `NV_MEMORY_ALLOCATION_PARAMS` asking for 2 MiB of video memory.
#[repr(C, align(8))]
struct MemParams([u8; 128]);

fn mem_params() -> Box<MemParams> {
    let mut p = Box::new(MemParams([0; 128]));
    let size = 2u64 << 20;
    p.0[nv::off::MEM_PARAMS_SIZE..nv::off::MEM_PARAMS_SIZE + 8].copy_from_slice(&size.to_le_bytes());
    let attr = nv::ATTR_LOCATION_VIDMEM << 25;
    p.0[nv::off::MEM_PARAMS_ATTR..nv::off::MEM_PARAMS_ATTR + 4].copy_from_slice(&attr.to_le_bytes());
    p
}

fn rm_alloc_args(params: &MemParams) -> Box<Nvos64> {
    Box::new(Nvos64 {
        h_root: 0xc1d0_0001,
        h_object_parent: 0xcaf0_0002,
        h_object_new: 0xcaf0_0100,
        h_class: nv::class::NV01_MEMORY_LOCAL_USER,
        p_alloc_parms: params as *const MemParams as u64,
        p_rights_requested: 0,
        params_size: 128,
        flags: 0,
        status: 0,
        _pad: 0,
    })
}

fn open(path: &str, flags: libc::c_int) -> Result<libc::c_int> {
    let c = CString::new(path)?;
    // SAFETY: valid NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("opening {path}"));
    }
    Ok(fd)
}

fn arg<T: std::str::FromStr>(args: &[String], i: usize, what: &str) -> Result<T> {
    args.get(i)
        .with_context(|| format!("worker: missing {what}"))?
        .parse()
        .map_err(|_| anyhow::anyhow!("worker: bad {what}: {:?}", args[i]))
}

/// `"<cpu> <wall>"`: ns per call of `f` over `calls` calls, by the thread's CPU time (what the calls
/// cost, whatever else the machine runs) and by the wall clock.
fn time_calls(calls: u64, f: impl FnMut()) -> String {
    let (cpu, wall) = time_calls_ns(calls, f);
    format!("{cpu} {wall}")
}

/// A foreign ioctl for the syscall workers: `TCGETS` on `/dev/null`, which answers -ENOTTY.
fn null_ioctl() -> Result<impl Fn()> {
    let null = open("/dev/null", libc::O_RDONLY)?;
    // SAFETY: termios is plain data; leaked, as it lives as long as the worker.
    let tio: &'static mut libc::termios = Box::leak(Box::new(unsafe { std::mem::zeroed() }));
    let tio = tio as *mut libc::termios;
    // SAFETY: a valid fd and out-pointer.
    Ok(move || unsafe {
        black_box(libc::ioctl(null, libc::TCGETS as _, tio));
    })
}

/// The NVIDIA workers' arguments after the mode: CPU PATH CALLS RUNS WARMUP.
fn nv_args(args: &[String]) -> Result<(usize, String, u64, u32, u64)> {
    Ok((
        arg(args, 1, "cpu")?,
        arg(args, 2, "path")?,
        arg(args, 3, "calls")?,
        arg(args, 4, "runs")?,
        arg(args, 5, "warmup")?,
    ))
}

/// `getppid` as a raw syscall, so libc cannot cache it.
fn getppid() {
    // SAFETY: getppid has no arguments.
    unsafe {
        black_box(libc::syscall(libc::SYS_getppid));
    }
}

/// `(cpu, wall)` ns per call of `f` over `calls` calls.
#[inline(never)]
fn time_calls_ns(calls: u64, mut f: impl FnMut()) -> (f64, f64) {
    let c = sys::thread_cpu_ns();
    let t = Instant::now();
    for _ in 0..calls {
        f();
    }
    let wall = t.elapsed().as_nanos() as f64;
    let cpu = (sys::thread_cpu_ns() - c) as f64;
    let n = calls.max(1) as f64;
    (cpu / n, wall / n)
}

pub fn main(args: &[String]) -> Result<()> {
    match args.first().map(String::as_str) {
        // syscalls CPU CALLS RUNS WARMUP: foreign ioctl and getppid, runs interleaved.
        Some("syscalls") => {
            let (cpu, calls, runs, warmup): (usize, u64, u32, u64) =
                (arg(args, 1, "cpu")?, arg(args, 2, "calls")?, arg(args, 3, "runs")?, arg(args, 4, "warmup")?);
            sys::pin_to(cpu).context("pinning the worker")?;
            let ioctl = null_ioctl()?;
            time_calls(warmup, &ioctl);
            time_calls(warmup, getppid);
            for _ in 0..runs {
                println!("ioctl_null {}", time_calls(calls, &ioctl));
                println!("getppid {}", time_calls(calls, getppid));
            }
            Ok(())
        }
        // nv CPU PATH CALLS RUNS WARMUP: RM_ALLOC on a (fake) nvidiactl.
        // nv CPU PATH CALLS RUNS WARMUP [VARIANT]: RM_ALLOC on a (fake) nvidiactl. VARIANT `full`
        // (default: memory class, nested parameters followed), `no-nested` (a class without nested
        // parameters), `bare` (an escape without a capture plan and `_IOC_SIZE` 0: no user memory read).
        Some("nv") => {
            let (cpu, path, calls, runs, warmup) = nv_args(args)?;
            let variant = args.get(6).map(String::as_str).unwrap_or("full");
            sys::pin_to(cpu).context("pinning the worker")?;
            let fd = open(&path, libc::O_RDWR)?;
            let params = mem_params();
            let mut a = rm_alloc_args(&params);
            let cmd = match variant {
                "full" => RM_ALLOC_NVOS64,
                "no-nested" => {
                    a.h_class = 0x1234;
                    RM_ALLOC_NVOS64
                }
                "bare" => BARE_CMD,
                other => bail!("unknown nv variant {other:?}"),
            };
            let ptr = &*a as *const Nvos64 as *mut libc::c_void;
            // SAFETY: valid fd and a valid 48-byte argument with a valid nested pointer.
            let call = || unsafe {
                black_box(libc::ioctl(fd, cmd as _, ptr));
            };
            // SAFETY: as above; the fake node is a regular file.
            let ret = unsafe { libc::ioctl(fd, cmd as _, ptr) };
            let errno = std::io::Error::last_os_error();
            println!("first_ret {ret} {}", errno.raw_os_error().unwrap_or(0));
            time_calls(warmup.saturating_sub(1), call);
            for _ in 0..runs {
                println!("nv {}", time_calls(calls, call));
            }
            println!("total {}", warmup.max(1) + calls * runs as u64);
            black_box(&params);
            Ok(())
        }
        // nv-held CPU PATH CALLS RUNS WARMUP: open PATH, say `opened`, wait for a line on stdin
        // (the driver-entry bench stops the module double's server meanwhile, so that its ioctls
        // are answered in the kernel), then RUNS rounds of getppid, a foreign ioctl and RM_ALLOC;
        // before each timed phase it says `ready PHASE` and waits for a line, so the bench can
        // read the programs' run statistics at the phase's edges.
        Some("nv-held") => {
            let (cpu, path, calls, runs, warmup) = nv_args(args)?;
            sys::pin_to(cpu).context("pinning the worker")?;
            let fd = open(&path, libc::O_RDWR)?;
            let ioctl = null_ioctl()?;
            use std::io::{BufRead, Write};
            let wait = |say: &str| -> Result<()> {
                println!("{say}");
                std::io::stdout().flush()?;
                let mut line = String::new();
                std::io::stdin().lock().read_line(&mut line)?;
                Ok(())
            };
            wait("opened")?;
            let params = mem_params();
            let a = rm_alloc_args(&params);
            let ptr = &*a as *const Nvos64 as *mut libc::c_void;
            // SAFETY: valid fd and a valid 48-byte argument with a valid nested pointer.
            let nv = || unsafe {
                black_box(libc::ioctl(fd, RM_ALLOC_NVOS64 as _, ptr));
            };
            // SAFETY: as above.
            let ret = unsafe { libc::ioctl(fd, RM_ALLOC_NVOS64 as _, ptr) };
            println!("first_ret {ret} {}", std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
            time_calls(warmup, nv);
            time_calls(warmup, &ioctl);
            time_calls(warmup, getppid);
            let phases: [(&str, &dyn Fn()); 3] = [("getppid", &getppid), ("ioctl_null", &ioctl), ("nv", &nv)];
            for _ in 0..runs {
                for (name, f) in phases {
                    wait(&format!("ready {name}"))?;
                    println!("{name} {}", time_calls(calls, f));
                }
            }
            println!("total {}", 1 + warmup + calls * runs as u64);
            black_box(&params);
            Ok(())
        }
        // flood PATH CALLS_PER_THREAD CPU[,CPU...]: one producer thread per listed CPU, as fast as
        // possible, all starting together.
        Some("flood") => {
            let (path, calls, cpus): (String, u64, String) =
                (arg(args, 1, "path")?, arg(args, 2, "calls")?, arg(args, 3, "cpus")?);
            let cpus: Vec<usize> = cpus.split(',').map(|c| c.parse()).collect::<Result<_, _>>().context("cpus")?;
            let fd = open(&path, libc::O_RDWR)?;
            let barrier = std::sync::Arc::new(std::sync::Barrier::new(cpus.len() + 1));
            let mut threads = Vec::new();
            for &cpu in &cpus {
                let b = barrier.clone();
                threads.push(std::thread::spawn(move || {
                    let _ = sys::pin_to(cpu);
                    let params = mem_params();
                    let a = rm_alloc_args(&params);
                    let ptr = &*a as *const Nvos64 as *mut libc::c_void;
                    b.wait();
                    let t = Instant::now();
                    for _ in 0..calls {
                        // SAFETY: valid fd and argument.
                        black_box(unsafe { libc::ioctl(fd, RM_ALLOC_NVOS64 as _, ptr) });
                    }
                    black_box(&params);
                    t.elapsed().as_nanos() as u64
                }));
            }
            barrier.wait();
            let t = Instant::now();
            let mut slowest = 0;
            for th in threads {
                slowest = slowest.max(th.join().map_err(|_| anyhow::anyhow!("producer panicked"))?);
            }
            let wall = t.elapsed().as_nanos() as u64;
            println!("flood {} {} {}", wall.max(slowest), calls * cpus.len() as u64, cpus.len());
            Ok(())
        }
        // cuda LIB CPU WARMUP TARGET_MS MIN_CALLS MAX_CALLS: cuLaunchKernel through the pointer
        // cuGetProcAddress_v2 returns, in a tight loop. The timed run makes as many calls as the
        // warm-up says fit in TARGET_MS (within MIN_CALLS..=MAX_CALLS).
        Some("cuda") => {
            let (lib, cpu, warmup, target_ms, min_calls, max_calls): (String, usize, u64, u64, u64, u64) = (
                arg(args, 1, "lib")?,
                arg(args, 2, "cpu")?,
                arg(args, 3, "warmup")?,
                arg(args, 4, "target_ms")?,
                arg(args, 5, "min_calls")?,
                arg(args, 6, "max_calls")?,
            );
            sys::pin_to(cpu).context("pinning the worker")?;
            let l = Launcher::open(&lib).map_err(anyhow::Error::msg)?;
            println!("pid {}", std::process::id());
            println!("init {}", l.init_result);
            println!("resolved {} {:#x} {:#x}", l.resolved_via, l.addr, l.dlsym_addr);
            println!("first_ret {}", l.call());
            let (est, _) = time_calls_ns(warmup.max(1), || {
                black_box(l.call());
            });
            let calls = ((target_ms as f64 * 1e6 / est.max(1.0)) as u64).clamp(min_calls, max_calls.max(min_calls));
            let (c, w) = time_calls_ns(calls, || {
                black_box(l.call());
            });
            println!("cuda {c} {w}");
            println!("calls {calls}");
            println!("total {}", 1 + warmup.max(1) + calls);
            Ok(())
        }
        // cuda-threads LIB CALLS_PER_THREAD CPU[,CPU...]: one launching thread per listed CPU, all
        // starting together; prints `threads <slowest ns> <calls> <threads> <failed> <CPU ns of all threads>`.
        Some("cuda-threads") => {
            let (lib, calls, cpus): (String, u64, String) =
                (arg(args, 1, "lib")?, arg(args, 2, "calls")?, arg(args, 3, "cpus")?);
            let cpus: Vec<usize> = cpus.split(',').map(|c| c.parse()).collect::<Result<_, _>>().context("cpus")?;
            let l = Launcher::open(&lib).map_err(anyhow::Error::msg)?;
            println!("pid {}", std::process::id());
            println!("init {}", l.init_result);
            println!("first_ret {}", l.call());
            let barrier = std::sync::Arc::new(std::sync::Barrier::new(cpus.len() + 1));
            let mut threads = Vec::new();
            for &cpu in &cpus {
                let b = barrier.clone();
                threads.push(std::thread::spawn(move || {
                    let _ = sys::pin_to(cpu);
                    b.wait();
                    let (t, c) = (Instant::now(), sys::thread_cpu_ns());
                    let mut failed = 0u64;
                    for _ in 0..calls {
                        failed += u64::from(black_box(l.call()) != 0);
                    }
                    (t.elapsed().as_nanos() as u64, failed, sys::thread_cpu_ns() - c)
                }));
            }
            barrier.wait();
            let t = Instant::now();
            let (mut slowest, mut failed, mut cpu) = (0, 0, 0);
            for th in threads {
                let (ns, f, c) = th.join().map_err(|_| anyhow::anyhow!("launch thread panicked"))?;
                slowest = slowest.max(ns);
                failed += f;
                cpu += c;
            }
            let wall = t.elapsed().as_nanos() as u64;
            println!("threads {} {} {} {failed} {cpu}", wall.max(slowest), calls * cpus.len() as u64, cpus.len());
            println!("total {}", 1 + calls * cpus.len() as u64);
            Ok(())
        }
        other => bail!("unknown worker mode {other:?}"),
    }
}
