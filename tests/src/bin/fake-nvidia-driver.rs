//! `fake-nvidia-driver`: serve fake `/dev/nvidia*` files over FUSE (see
//! `gpu_tracer_tests::fake_driver` for what is emulated and what cannot be).

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Parser;
use gpu_tracer_tests::fake_driver::{self, DriverConfig, FakeNvidiaFs, rm};

#[derive(Parser, Debug)]
#[command(
    about = "Fake NVIDIA driver over FUSE: nvidiactl, nvidiaN, nvidia-uvm, ... as regular files that answer ioctls"
)]
struct Args {
    /// Directory to mount on (created if missing).
    #[arg(long)]
    mount: PathBuf,
    /// Number of GPUs (nvidia0..nvidia{N-1}), at most 248.
    #[arg(long, default_value_t = 1)]
    gpus: u32,
    /// Video memory per GPU, in bytes.
    #[arg(long, default_value_t = rm::DEFAULT_GPU_MEMORY_BYTES)]
    gpu_memory_bytes: u64,
    /// Driver version to report and whose struct sizes to check.
    #[arg(long, default_value = "535.261.03")]
    driver_version: String,
    /// File to create once the mount is ready (removed on exit).
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
    std::fs::create_dir_all(&args.mount).with_context(|| format!("mkdir {}", args.mount.display()))?;
    if fake_driver::is_stale_mount(&args.mount) {
        // A previous server died without unmounting: take the dead mount away first.
        fake_driver::detach(&args.mount).with_context(|| format!("detach stale mount {}", args.mount.display()))?;
    }
    let mount = args.mount.canonicalize().with_context(|| format!("canonicalize {}", args.mount.display()))?;

    // Block the stop signals in every thread (the FUSE threads inherit this mask); one thread
    // waits for them and tears the mount down.
    let signals = stop_signals();
    // SAFETY: `signals` is a valid, initialized signal set.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &signals, std::ptr::null_mut()) };
    if rc != 0 {
        bail!("pthread_sigmask: {}", std::io::Error::from_raw_os_error(rc));
    }

    let cfg = DriverConfig { gpus: args.gpus, gpu_memory_bytes: args.gpu_memory_bytes, version };
    let session = fake_driver::mount(FakeNvidiaFs::new(cfg, args.trace), &mount)
        .with_context(|| format!("mount FUSE on {}", mount.display()))?;

    if let Some(ready) = &args.ready_file {
        let tmp = ready.with_extension("tmp");
        std::fs::write(&tmp, format!("{}\n{}\n", std::process::id(), mount.display()))
            .and_then(|()| std::fs::rename(&tmp, ready))
            .with_context(|| format!("write {}", ready.display()))?;
    }

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
