//! `fake-nvidia-driver`: serve fake `/dev/nvidia*` files over FUSE, or (`--kmod`) serve the
//! kernel-module double's requests (see `gpu_tracer_tests::fake_driver` for what is emulated and
//! what cannot be, and `fake_driver::kmod` for the kernel-module transport).

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Parser;
use gpu_tracer_tests::fake_driver::{self, DriverConfig, FakeNvidiaFs, kmod, rm};

#[derive(Parser, Debug)]
#[command(
    about = "Fake NVIDIA driver over FUSE: nvidiactl, nvidiaN, nvidia-uvm, ... as regular files that answer ioctls \
             (or, with --kmod, the server of the kernel-module double's /dev/nvidia* devices)"
)]
struct Args {
    /// Directory to mount on (created if missing).
    #[arg(long, required_unless_present = "kmod", conflicts_with = "kmod")]
    mount: Option<PathBuf>,
    /// Serve the kernel-module double (tests/kmod: nvidia.ko and nvidia-uvm.ko, loaded with the
    /// same number of GPUs) through /dev/nvidia-double instead of mounting FUSE.
    #[arg(long)]
    kmod: bool,
    /// With --kmod: where to write the stats (JSON, as FUSE's .fake-driver-stats), rewritten before
    /// each answer that changed them [default: /run/fake-nvidia-driver.stats.json].
    #[arg(long, conflicts_with = "mount")]
    stats_file: Option<PathBuf>,
    /// Number of GPUs (nvidia0..nvidia{N-1}), at most 248.
    #[arg(long, default_value_t = 1)]
    gpus: u32,
    /// Video memory per GPU, in bytes.
    #[arg(long, default_value_t = rm::DEFAULT_GPU_MEMORY_BYTES)]
    gpu_memory_bytes: u64,
    /// Driver version to report and whose struct sizes to check.
    #[arg(long, default_value = "535.261.03")]
    driver_version: String,
    /// File to create once the mount (with --kmod: the control device) is ready (removed on exit).
    #[arg(long)]
    ready_file: Option<PathBuf>,
    /// Log every ioctl to stderr.
    #[arg(long)]
    trace: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.gpus == 0 || args.gpus > rm::MAX_GPUS {
        bail!("--gpus must be 1..={}", rm::MAX_GPUS);
    }
    let version = rm::parse_version(&args.driver_version)
        .with_context(|| format!("--driver-version {:?} is not major.minor.patch", args.driver_version))?;
    let cfg = DriverConfig { gpus: args.gpus, gpu_memory_bytes: args.gpu_memory_bytes, version };
    let Some(mount) = &args.mount else { return serve_kmod(&args, cfg) };
    std::fs::create_dir_all(mount).with_context(|| format!("mkdir {}", mount.display()))?;
    if fake_driver::is_stale_mount(mount) {
        // A previous server died without unmounting: take the dead mount away first.
        fake_driver::detach(mount).with_context(|| format!("detach stale mount {}", mount.display()))?;
    }
    let mount = mount.canonicalize().with_context(|| format!("canonicalize {}", mount.display()))?;

    // Block the stop signals in every thread (the FUSE threads inherit this mask); one thread
    // waits for them and tears the mount down.
    let signals = stop_signals();
    // SAFETY: `signals` is a valid, initialized signal set.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &signals, std::ptr::null_mut()) };
    if rc != 0 {
        bail!("pthread_sigmask: {}", std::io::Error::from_raw_os_error(rc));
    }

    let session = fake_driver::mount(FakeNvidiaFs::new(cfg, args.trace), &mount)
        .with_context(|| format!("mount FUSE on {}", mount.display()))?;

    write_ready(&args, &mount)?;

    let (stop_mount, stop_ready) = (mount.clone(), args.ready_file.clone());
    std::thread::spawn(move || {
        let mut sig = 0;
        // SAFETY: `signals` is valid and `sig` is a valid out-pointer.
        unsafe { libc::sigwait(&signals, &mut sig) };
        // Detach rather than unmount: a workload may still hold files open. Exiting then closes
        // /dev/fuse, which aborts the connection for those.
        let _ = fake_driver::detach(&stop_mount);
        if let Some(r) = stop_ready {
            let _ = std::fs::remove_file(r);
        }
        std::process::exit(0);
    });

    // Returns when the filesystem is unmounted from outside (umount / fusermount3 -u).
    let result = session.run();
    if let Some(r) = &args.ready_file {
        let _ = std::fs::remove_file(r);
    }
    result.context("FUSE session")
}

fn write_ready(args: &Args, what: &std::path::Path) -> anyhow::Result<()> {
    if let Some(ready) = &args.ready_file {
        let tmp = ready.with_extension("tmp");
        std::fs::write(&tmp, format!("{}\n{}\n", std::process::id(), what.display()))
            .and_then(|()| std::fs::rename(&tmp, ready))
            .with_context(|| format!("write {}", ready.display()))?;
    }
    Ok(())
}

/// `--kmod`: attach to the module's control device and answer its requests until stopped. On a
/// stop signal the process exits, which closes the control device: calls in flight then fail
/// with EIO, later ones with ENODEV.
fn serve_kmod(args: &Args, cfg: DriverConfig) -> anyhow::Result<()> {
    let parameter = std::path::Path::new(kmod::GPUS_PARAMETER);
    match kmod::module_gpus(parameter) {
        None if !std::path::Path::new("/sys/module/nvidia").exists() => bail!(
            "nvidia.ko is not loaded: load the double first (target/kmod/$(uname -r)/nvidia.ko gpus=N, then \
             nvidia-uvm.ko; built by `cargo xtask kmod` for Debian's 6.1 kernel), or use --mount for the FUSE double"
        ),
        None => bail!(
            "the loaded nvidia module has no {} parameter: it is not the double (a real driver?)",
            parameter.display()
        ),
        Some(n) if n != cfg.gpus => bail!(
            "nvidia.ko was loaded with gpus={n} but --gpus is {}: reload it (rmmod nvidia_uvm nvidia) or pass --gpus {n}",
            cfg.gpus
        ),
        Some(_) => {}
    }
    let mut control = std::fs::OpenOptions::new().read(true).write(true).open(kmod::CONTROL_DEVICE).map_err(|e| {
        let why = match e.raw_os_error() {
            Some(libc::EBUSY) => "another server is attached (one at a time)",
            Some(libc::EPERM) | Some(libc::EACCES) => "serving needs root (CAP_SYS_ADMIN)",
            Some(libc::ENOENT) => "no such device: is nvidia.ko the double, and is devtmpfs mounted on /dev?",
            _ => "see the error",
        };
        anyhow::anyhow!("open {}: {e}: {why}", kmod::CONTROL_DEVICE)
    })?;

    let signals = stop_signals();
    // SAFETY: `signals` is a valid, initialized signal set.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &signals, std::ptr::null_mut()) };
    if rc != 0 {
        bail!("pthread_sigmask: {}", std::io::Error::from_raw_os_error(rc));
    }
    let stats_file = args.stats_file.clone().unwrap_or_else(|| PathBuf::from("/run/fake-nvidia-driver.stats.json"));
    let mut server = kmod::KmodServer::new(cfg, Some(stats_file.clone()), args.trace);
    server.write_stats().with_context(|| format!("write {}", stats_file.display()))?;
    write_ready(args, std::path::Path::new(kmod::CONTROL_DEVICE))?;
    let stop_ready = args.ready_file.clone();
    std::thread::spawn(move || {
        let mut sig = 0;
        // SAFETY: `signals` is valid and `sig` is a valid out-pointer.
        unsafe { libc::sigwait(&signals, &mut sig) };
        if let Some(r) = stop_ready {
            let _ = std::fs::remove_file(r);
        }
        std::process::exit(0);
    });
    let result = server.serve(&mut control);
    if let Some(r) = &args.ready_file {
        let _ = std::fs::remove_file(r);
    }
    result.with_context(|| format!("serving {}", kmod::CONTROL_DEVICE))
}

fn stop_signals() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialize and fill the set we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}
