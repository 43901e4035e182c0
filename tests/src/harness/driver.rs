//! [`FakeDriver`]: the `fake-nvidia-driver` binary on a fresh temp dir, unmounted on drop; or
//! ([`FakeDriverBuilder::start_kmod`]) serving the kernel-module double's `/dev/nvidia*`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{HarnessError, Result, Workload, eventually, fresh_temp_dir, kmod, locate_binary, signal};
use crate::fake_driver::{DriverStats, STATS_FILE_NAME, detach, fake_driver_mounts, is_stale_mount};

const READY_TIMEOUT: Duration = Duration::from_secs(20);
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Settings for [`FakeDriver`].
#[derive(Debug, Clone)]
pub struct FakeDriverBuilder {
    gpus: u32,
    gpu_memory_bytes: Option<u64>,
    driver_version: Option<String>,
    binary: Option<PathBuf>,
    trace: bool,
    module_btf: bool,
}

impl FakeDriverBuilder {
    /// Number of GPUs (default 1).
    pub fn gpus(mut self, n: u32) -> Self {
        self.gpus = n;
        self
    }

    /// Video memory per GPU (default 80 GiB).
    pub fn gpu_memory_bytes(mut self, b: u64) -> Self {
        self.gpu_memory_bytes = Some(b);
        self
    }

    /// Driver version to report, e.g. `550.54.14` (default `535.261.03`).
    pub fn driver_version(mut self, v: &str) -> Self {
        self.driver_version = Some(v.into());
        self
    }

    /// Path of the `fake-nvidia-driver` binary (default: [`locate_binary`]).
    pub fn binary(mut self, p: impl Into<PathBuf>) -> Self {
        self.binary = Some(p.into());
        self
    }

    /// The kernel-module double with BTF (`/sys/kernel/btf/nvidia`, driver-entry mode on
    /// fentry/fexit; the default where the kernel loads module BTF, 5.11 on) or without, as
    /// NVIDIA's DKMS builds usually are (kprobes; the default, and the only build, before 5.11).
    pub fn module_btf(mut self, on: bool) -> Self {
        self.module_btf = on;
        self
    }

    /// Have the driver log every ioctl to stderr.
    pub fn trace(mut self, on: bool) -> Self {
        self.trace = on;
        self
    }

    fn binary_path(&self) -> Result<PathBuf> {
        match &self.binary {
            Some(b) => Ok(b.clone()),
            None => locate_binary("fake-nvidia-driver"),
        }
    }

    /// The options both transports take.
    fn common_args(&self, cmd: &mut Command, ready: &Path) {
        cmd.arg("--gpus").arg(self.gpus.to_string()).arg("--ready-file").arg(ready);
        if let Some(b) = self.gpu_memory_bytes {
            cmd.arg("--gpu-memory-bytes").arg(b.to_string());
        }
        if let Some(v) = &self.driver_version {
            cmd.arg("--driver-version").arg(v);
        }
        if self.trace {
            cmd.arg("--trace");
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::inherit());
    }

    /// Serve the kernel-module double instead: load `target/kmod/$(uname -r)/nvidia.ko gpus=N`
    /// and `nvidia-uvm.ko` unless loaded with that count (reloading them otherwise), then run
    /// `fake-nvidia-driver --kmod`; returns once it is attached to `/dev/nvidia-double`. The
    /// device directory is `/dev`; the modules stay loaded after the driver is dropped (calls then
    /// fail with ENODEV). Only one such driver can run at a time.
    pub fn start_kmod(self) -> Result<FakeDriver> {
        let binary = self.binary_path()?;
        kmod::ensure_loaded(self.gpus, self.module_btf)?;
        let root = fresh_temp_dir("gpu-tracer-nvidia-double")?;
        let ready = root.join("ready");
        let stats = root.join("stats.json");
        let mut cmd = Command::new(&binary);
        cmd.arg("--kmod").arg("--stats-file").arg(&stats);
        self.common_args(&mut cmd, &ready);
        let child = cmd.spawn().map_err(|e| HarnessError::io(format!("spawn {}", binary.display()), e))?;
        let mut driver = FakeDriver {
            child: Some(child),
            root,
            dev: PathBuf::from("/dev"),
            gpus: self.gpus,
            kmod_stats: Some(stats),
        };
        driver.wait_ready(&ready)?;
        Ok(driver)
    }

    /// Mount it; returns once the mount answers.
    pub fn start(self) -> Result<FakeDriver> {
        // Not beside the module double: `auto` would attach to it instead (see `kmod::unload_double`).
        kmod::unload_double()?;
        cleanup_stale_mounts();
        let binary = self.binary_path()?;
        let root = fresh_temp_dir("gpu-tracer-fake-nvidia")?;
        let dev = root.join("dev");
        let ready = root.join("ready");
        std::fs::create_dir(&dev).map_err(|e| HarnessError::io(format!("mkdir {}", dev.display()), e))?;
        // mountinfo shows the canonical path (fuser canonicalizes the mount point).
        let dev = dev.canonicalize().map_err(|e| HarnessError::io(format!("canonicalize {}", dev.display()), e))?;
        let mut cmd = Command::new(&binary);
        cmd.arg("--mount").arg(&dev);
        self.common_args(&mut cmd, &ready);
        let child = cmd.spawn().map_err(|e| HarnessError::io(format!("spawn {}", binary.display()), e))?;
        let mut driver = FakeDriver { child: Some(child), root, dev, gpus: self.gpus, kmod_stats: None };
        driver.wait_ready(&ready)?;
        Ok(driver)
    }
}

/// A running fake NVIDIA driver mounted on a fresh directory. Dropping it stops the server,
/// unmounts (lazily, if files are still open) and removes the directory. For the kernel-module
/// double ([`FakeDriverBuilder::start_kmod`]) the devices are `/dev`'s and dropping stops the
/// server only.
#[derive(Debug)]
pub struct FakeDriver {
    child: Option<Child>,
    root: PathBuf,
    dev: PathBuf,
    gpus: u32,
    /// The kernel-module double's stats file (`None`: FUSE, stats in the mount).
    kmod_stats: Option<PathBuf>,
}

impl FakeDriver {
    /// Settings, starting from one GPU with the defaults.
    pub fn builder() -> FakeDriverBuilder {
        FakeDriverBuilder {
            gpus: 1,
            gpu_memory_bytes: None,
            driver_version: None,
            binary: None,
            trace: false,
            module_btf: kmod::kernel_loads_module_btf(),
        }
    }

    /// A driver with `gpus` GPUs and default settings.
    pub fn start(gpus: u32) -> Result<Self> {
        Self::builder().gpus(gpus).start()
    }

    /// The device directory (pass it to `nv-workload --dev-dir` or the tracer's `/dev` setting).
    pub fn dev_dir(&self) -> &Path {
        &self.dev
    }

    /// Path of a device file, e.g. `path("nvidiactl")`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dev.join(name)
    }

    /// Number of GPUs served.
    pub fn gpus(&self) -> u32 {
        self.gpus
    }

    /// The server's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The driver's current view (reads `.fake-driver-stats`, or the kernel-module double's stats
    /// file).
    pub fn stats(&self) -> Result<DriverStats> {
        let p = self.kmod_stats.clone().unwrap_or_else(|| self.dev.join(STATS_FILE_NAME));
        let text = std::fs::read_to_string(&p).map_err(|e| HarnessError::io(format!("read {}", p.display()), e))?;
        serde_json::from_str(&text).map_err(|e| HarnessError::Protocol(format!("bad stats JSON: {e}")))
    }

    /// The bad-argument calls of `w` (initialised), each answered as the real driver answers it,
    /// with nothing bad reaching the model: `bad-null`/`bad-unmapped`/`bad-guard` fail the copy-in
    /// with `EFAULT` (no RM_ALLOC counted), `bad-size` and `bad-unknown` get `EINVAL` from the
    /// model, `bad-nested-null` an RM status `0x1f`, and 400 racing calls return. Both transports
    /// (FUSE, the kernel module) must pass it. Returns the stats from before the calls.
    pub fn assert_bad_arguments_refused(&self, w: &mut Workload) -> DriverStats {
        let ok = |w: &mut Workload, cmd: &str| w.ok(cmd).unwrap_or_else(|e| panic!("{cmd}: {e}"));
        let before = self.stats().expect("driver stats");
        for (cmds, errno) in [
            (&["bad-null", "bad-unmapped", "bad-guard"][..], libc::EFAULT),
            (&["bad-size", "bad-unknown"], libc::EINVAL),
        ] {
            for cmd in cmds {
                let a = ok(w, cmd);
                assert_eq!(
                    (a.signed("ret").unwrap(), a.number("errno").unwrap()),
                    (-1, errno as u64),
                    "{cmd}: {}",
                    a.line
                );
            }
            if errno == libc::EFAULT {
                // Bad pointers fail in the copy-in, before the model sees anything.
                assert_eq!(self.stats().unwrap().ioctl_calls("RM_ALLOC"), before.ioctl_calls("RM_ALLOC"));
            }
        }
        let a = ok(w, "bad-nested-null");
        assert_eq!(a.signed("ret").unwrap(), 0);
        assert_eq!(a.get("status"), Some("0x1f"), "NV_ERR_INVALID_ARGUMENT: {}", a.line);
        let a = ok(w, "bad-race 400");
        assert_eq!(a.number("calls").unwrap(), 400);
        assert!(w.is_running());
        before
    }

    /// Poll the stats until `pred` holds (releases reach the driver asynchronously).
    pub fn wait_for_stats(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&DriverStats) -> bool,
    ) -> Result<DriverStats> {
        eventually(what, timeout, || self.stats().ok().filter(|s| pred(s)))
    }

    /// Whether this is the kernel-module double.
    pub fn is_kmod(&self) -> bool {
        self.kmod_stats.is_some()
    }

    fn wait_ready(&mut self, ready: &Path) -> Result<()> {
        let start = Instant::now();
        loop {
            if ready.exists() && (self.is_kmod() || fake_driver_mounts().iter().any(|m| m == &self.dev)) {
                return Ok(());
            }
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                return Err(HarnessError::Exited { what: "fake-nvidia-driver".into(), status });
            }
            if start.elapsed() > READY_TIMEOUT {
                return Err(HarnessError::Timeout { what: "fake-nvidia-driver mount".into(), after: READY_TIMEOUT });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stop the server and clean up now (also done on drop).
    pub fn stop(mut self) -> Result<()> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            signal(child.id(), libc::SIGTERM);
            let start = Instant::now();
            while child.try_wait().ok().flatten().is_none() {
                if start.elapsed() > STOP_TIMEOUT {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        if let Some(stats) = &self.kmod_stats {
            // The devices are /dev's and stay; only the server's files go.
            let _ = std::fs::remove_file(stats);
            let _ = std::fs::remove_file(stats.with_extension("tmp"));
        } else {
            // The server detaches its own mount on SIGTERM; after a SIGKILL the mount is left
            // behind with a dead connection.
            if fake_driver_mounts().iter().any(|m| m == &self.dev) {
                let _ = detach(&self.dev);
            }
            let _ = std::fs::remove_dir(&self.dev);
        }
        let _ = std::fs::remove_file(self.root.join("ready"));
        std::fs::remove_dir(&self.root).map_err(|e| HarnessError::io(format!("rmdir {}", self.root.display()), e))
    }
}

impl Drop for FakeDriver {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// Detach fake-driver mounts left behind by crashed runs (their server is gone: `ENOTCONN`).
/// Live mounts of concurrently running tests are left alone.
pub fn cleanup_stale_mounts() {
    for m in fake_driver_mounts() {
        if is_stale_mount(&m) && detach(&m).is_ok() {
            let _ = std::fs::remove_dir(&m);
        }
    }
}
