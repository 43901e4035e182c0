//! `cargo xtask image`: the container image, built without a registry or a daemon.
//!
//! Two Debian root file systems come from the package mirror with `mmdebstrap` (cached as tars
//! under `target/image/base/`, keyed by what they were made from): `strip` (the essential set plus
//! binutils and ca-certificates; the Dockerfile's first stage strips the binary there) and `runtime`
//! (base-files, libc6, libgcc-s1, netbase, nothing else: no shell, no package manager). buildah
//! turns them into local base images and builds the repository's `Dockerfile` over them with vfs
//! storage and chroot isolation (no overlay mounts, no runtime, no cgroup manager), all under
//! `target/image/`. The image is written as an oci-archive, then checked by running
//! `gpu-tracer --version` and `gpu-tracer doctor` inside it, as its default user (65532) and as the
//! chart's DaemonSet runs it (uid 0 with its capability list). docs/image.md says why.

use crate::cmd;
use anyhow::{Context, bail};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The name the archive gives the image, as Kubernetes spells `image: gpu-tracer:TAG`: containerd
/// and the kubelet turn a bare name into `docker.io/library/NAME`.
const ARCHIVE_NAME: &str = "docker.io/library/gpu-tracer";
/// The name in buildah's own storage under `target/image/`.
const LOCAL_NAME: &str = "localhost/gpu-tracer";
/// The goal of issue 11 for the image, uncompressed.
pub const SIZE_GOAL_BYTES: u64 = 60_000_000;
/// The uid:gid the Dockerfile's `USER` names (distroless' `nonroot`).
const IMAGE_USER: &str = "65532:65532";
/// What the chart's DaemonSet grants (deploy/helm/gpu-tracer, docs/security.md): uid 0, every
/// capability dropped but these.
const DAEMONSET_CAPS: &[&str] = &["BPF", "PERFMON", "SYS_PTRACE", "DAC_READ_SEARCH"];
/// What `buildah run --user 0:0` grants by default (containers.conf's default_capabilities).
const BUILDAH_DEFAULT_CAPS: &[&str] = &[
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];
/// Where Debian's libnvidia-ml1 puts NVML (the chart's driverLibDir default).
const HOST_NVML: &str = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1";
const DEBIAN_SUITE: &str = "bookworm";
/// The archives the root file systems come from: the suite, its updates, and its security updates
/// (mmdebstrap alone would take the suite only, without the security fixes of libc6).
const DEBIAN_SOURCES: &[&str] = &[
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
];
/// Without it usrmerge is installed, which pulls in perl (+60 MB).
const MERGED_USR_HOOKS: &str = "/usr/share/mmdebstrap/hooks/merged-usr";
/// Documentation and translations are left out of both root file systems; the copyright files stay.
const DPKG_EXCLUDES: &[&str] = &[
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/doc/*",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/doc/*/copyright",
];
/// The extract variant installs nothing, so it leaves no dpkg database; this writes
/// /var/lib/dpkg/status from the packages' control files so vulnerability scanners (trivy, grype,
/// syft) see what the image holds.
const DPKG_STATUS_HOOK: &str = r#"mkdir -p "$1/var/lib/dpkg" && for d in "$1"/var/cache/apt/archives/*.deb; do dpkg-deb --field "$d" | awk 'NR == 1 { print; print "Status: install ok installed"; next } { print }'; echo; done > "$1/var/lib/dpkg/status""#;

/// A root file system made with mmdebstrap.
struct BaseSpec {
    /// `strip` or `runtime`: the file and image names.
    name: &'static str,
    /// For the progress line.
    purpose: &'static str,
    variant: &'static str,
    include: &'static [&'static str],
    dpkg_extra: &'static [&'static str],
    extract_hook: Option<&'static str>,
}

const STRIP_BASE: BaseSpec = BaseSpec {
    name: "strip",
    purpose: "where the Dockerfile's first stage strips the binary",
    variant: "essential",
    include: &["binutils", "ca-certificates"],
    dpkg_extra: &[],
    extract_hook: None,
};

const RUNTIME_BASE: BaseSpec = BaseSpec {
    name: "runtime",
    purpose: "what the image is made of",
    variant: "extract",
    include: &["base-files", "libc6", "libgcc-s1", "netbase"],
    // iconv's character-set modules (7 MB): nothing in a Rust program calls iconv.
    dpkg_extra: &["path-exclude=/usr/lib/*/gconv/*"],
    extract_hook: Some(DPKG_STATUS_HOOK),
};

impl BaseSpec {
    /// mmdebstrap's arguments, less the output file.
    fn args(&self) -> Vec<String> {
        let mut a = vec![
            format!("--variant={}", self.variant),
            "--format=tar".to_string(),
            format!("--hook-dir={MERGED_USR_HOOKS}"),
            format!("--include={}", self.include.join(",")),
        ];
        a.extend(DPKG_EXCLUDES.iter().chain(self.dpkg_extra).map(|o| format!("--dpkgopt={o}")));
        a.extend(self.extract_hook.map(|h| format!("--extract-hook={h}")));
        a.push(DEBIAN_SUITE.to_string());
        a
    }

    /// Names the cache entry after everything that decides its content (but the mirror's state:
    /// `--refresh-base` takes the newest packages).
    fn key(&self) -> String {
        let mut all = self.args();
        all.extend(DEBIAN_SOURCES.iter().map(|s| s.to_string()));
        format!("{:016x}", fnv1a64(all.join("\n").as_bytes()))
    }
}

/// FNV-1a: a stable hash for cache keys (std's hashers may change between Rust releases).
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// `cargo xtask image` options.
pub struct Options {
    /// Pack this binary instead of building one.
    pub binary: Option<PathBuf>,
    /// Write the archive here instead of `target/image/`.
    pub out: Option<PathBuf>,
    /// Tag instead of the binary's version.
    pub tag: Option<String>,
    /// Make the root file systems again (newest packages from the mirror).
    pub refresh_base: bool,
}

/// buildah with its storage under `target/image/`: vfs (no overlay mounts; works in any container
/// or VM) and chroot isolation (no OCI runtime, no cgroup manager).
struct Buildah {
    dir: PathBuf,
}

impl Buildah {
    fn cmd(&self) -> Command {
        let mut c = Command::new("buildah");
        c.arg("--root").arg(self.dir.join("storage")).arg("--runroot").arg(self.dir.join("runroot"));
        c.args(["--storage-driver", "vfs"]).env("BUILDAH_ISOLATION", "chroot");
        c
    }

    fn image_exists(&self, name: &str) -> bool {
        cmd::output(self.cmd().args(["inspect", "--type", "image", name])).is_ok()
    }
}

/// A working container, removed when dropped (also when a check fails).
struct WorkingContainer<'a> {
    buildah: &'a Buildah,
    id: String,
}

impl Drop for WorkingContainer<'_> {
    fn drop(&mut self) {
        let _ = cmd::output(self.buildah.cmd().args(["rm", &self.id]));
    }
}

/// What one `buildah run` printed.
struct RunOutput {
    /// The exit code buildah returned (the command's, or 1 when buildah itself failed).
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

pub fn run(opts: &Options) -> anyhow::Result<()> {
    let start = Instant::now();
    preflight()?;
    let binary = match &opts.binary {
        Some(b) => {
            let b = fs::canonicalize(b)
                .with_context(|| format!("cause: --binary {} does not exist; fix: pass the gpu-tracer binary (target/release/gpu-tracer after `cargo xtask build`)", b.display()))?;
            println!("image: packing {} (--binary; not rebuilt)", b.display());
            b
        }
        None => {
            crate::build::run()?;
            target_dir()?.join("release").join("gpu-tracer")
        }
    };
    let version_line = host_version(&binary)?;
    let version = version_line.strip_prefix("gpu-tracer ").unwrap_or(&version_line).to_string();
    let tag = opts.tag.clone().unwrap_or_else(|| version.clone());
    if tag.is_empty() || !tag.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)) || tag.len() > 128 {
        bail!("cause: `{tag}` is not a valid image tag; fix: use letters, digits, `.`, `_` and `-` (at most 128)");
    }

    let work = target_dir()?.join("image");
    fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let _lock = lock(&work)?;
    let out_dir = opts.out.clone().unwrap_or_else(|| work.clone());
    fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let archive = fs::canonicalize(&out_dir)?.join(format!("gpu-tracer-{tag}.oci.tar"));

    let buildah = Buildah { dir: work.join("buildah") };
    let strip_base = base_image(&buildah, &work, &STRIP_BASE, opts.refresh_base)?;
    let runtime_base = base_image(&buildah, &work, &RUNTIME_BASE, opts.refresh_base)?;

    let image = format!("{LOCAL_NAME}:{tag}");
    build(&buildah, &work, &binary, &strip_base, &runtime_base, &image, &version)?;
    let result = check_and_write(&buildah, &image, &version_line, &archive, &tag);
    // The archive is the product; the image in vfs storage is a full copy of every layer.
    let _ = cmd::output(buildah.cmd().args(["rmi", &image]));
    let _ = cmd::output(buildah.cmd().args(["rmi", "--prune"]));
    let sizes = result?;

    let mb = |b: u64| b as f64 / 1e6;
    println!();
    println!("image: {} in {:.0} s", archive.display(), start.elapsed().as_secs_f64());
    println!(
        "image: {:.1} MB uncompressed ({} the {:.0} MB goal), {:.1} MB as the oci-archive (gzip layers)",
        mb(sizes.uncompressed),
        if sizes.uncompressed < SIZE_GOAL_BYTES { "under" } else { "OVER" },
        mb(SIZE_GOAL_BYTES),
        mb(sizes.archive)
    );
    print_how_to_use(&archive, &tag);
    Ok(())
}

/// Root and the tools `cargo xtask setup` installs.
fn preflight() -> anyhow::Result<()> {
    if !cmd::is_root() {
        bail!(
            "cause: mmdebstrap writes device nodes and file owners, and buildah's chroot isolation needs root (rootless \
             buildah needs subuid ranges and is not what this command sets up); fix: run it as root, \
             e.g. `sudo -E cargo xtask image`"
        );
    }
    let missing: Vec<&str> = ["buildah", "mmdebstrap", "dpkg-deb"]
        .into_iter()
        .filter(|t| cmd::output(Command::new(t).arg("--version")).is_err())
        .collect();
    if !missing.is_empty() {
        bail!("cause: {} not found; fix: `cargo xtask setup` (it installs buildah and mmdebstrap)", missing.join(", "));
    }
    if !Path::new(MERGED_USR_HOOKS).is_dir() {
        bail!("cause: {MERGED_USR_HOOKS} is missing (mmdebstrap older than 1.0?); fix: Debian 12's mmdebstrap package");
    }
    Ok(())
}

/// Where cargo builds (honours `CARGO_TARGET_DIR` and cargo config); no build, no setup.
fn target_dir() -> anyhow::Result<PathBuf> {
    let mut meta = Command::new(cmd::cargo_program());
    meta.current_dir(cmd::workspace_root()).args(["metadata", "--format-version", "1", "--no-deps"]);
    let out = cmd::output(&mut meta)?;
    let v: serde_json::Value = serde_json::from_str(&out).context("parsing `cargo metadata` output")?;
    v["target_directory"].as_str().map(PathBuf::from).context("`cargo metadata` names no target_directory")
}

/// `gpu-tracer --version` of the binary on this machine (`gpu-tracer 0.1.0`).
fn host_version(binary: &Path) -> anyhow::Result<String> {
    let out = cmd::output(Command::new(binary).arg("--version")).with_context(|| {
        format!("cause: {} does not run here; fix: pass a gpu-tracer binary built for this machine", binary.display())
    })?;
    let line = out.trim().to_string();
    if !line.starts_with("gpu-tracer ") {
        bail!(
            "cause: {} says `{line}` to --version, not `gpu-tracer VERSION`; fix: pass the gpu-tracer binary",
            binary.display()
        );
    }
    Ok(line)
}

/// An exclusive lock on `target/image/` (a test and a user may build at once; buildah's storage and
/// the cache would be shared), held while the value lives.
fn lock(work: &Path) -> anyhow::Result<fs::File> {
    use std::os::fd::AsRawFd;
    let path = work.join(".lock");
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: flock on an fd this function owns; no memory is passed.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        println!("image: waiting for another `cargo xtask image` ({} is locked)", path.display());
        // SAFETY: as above.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error()).with_context(|| format!("locking {}", path.display()));
        }
    }
    Ok(file)
}

/// The local base image of `spec` (`localhost/gpu-tracer-base/NAME:KEY`), made from the cached
/// root file system, which mmdebstrap makes first when it is missing.
fn base_image(buildah: &Buildah, work: &Path, spec: &BaseSpec, refresh: bool) -> anyhow::Result<String> {
    let key = spec.key();
    let name = format!("localhost/gpu-tracer-base/{}:{key}", spec.name);
    let dir = work.join("base").join(format!("{}-{key}", spec.name));
    let tar = dir.join("rootfs.tar");
    if refresh {
        let _ = cmd::output(buildah.cmd().args(["rmi", &name]));
        let _ = fs::remove_file(&tar);
    }
    if !tar.is_file() {
        forget_other_bases(buildah, work, spec.name, &key);
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let partial = dir.join("rootfs.partial.tar");
        println!(
            "image: making the {} root file system ({}) with mmdebstrap from the Debian mirror: {} ({}), about 30 s",
            spec.name,
            spec.purpose,
            spec.include.join(" "),
            spec.variant
        );
        let t = Instant::now();
        let mut mm = Command::new("mmdebstrap");
        mm.args(spec.args()).arg(&partial).args(DEBIAN_SOURCES);
        cmd::run(&mut mm).context(
            "cause: mmdebstrap could not make the root file system (its messages above say why); fix: check access \
             to deb.debian.org (apt's proxy settings apply), then rerun",
        )?;
        fs::rename(&partial, &tar).with_context(|| format!("renaming {} to {}", partial.display(), tar.display()))?;
        println!(
            "image: {} root file system done in {:.0} s ({:.1} MB; cached as {})",
            spec.name,
            t.elapsed().as_secs_f64(),
            fs::metadata(&tar)?.len() as f64 / 1e6,
            tar.display()
        );
    }
    if !buildah.image_exists(&name) {
        let t = Instant::now();
        fs::write(dir.join("Containerfile"), "FROM scratch\nADD rootfs.tar /\n")
            .with_context(|| format!("writing {}", dir.display()))?;
        let mut b = buildah.cmd();
        b.args(["build", "--quiet", "--isolation", "chroot", "--pull=never", "-t", &name, "-f"])
            .arg(dir.join("Containerfile"))
            .arg(&dir);
        cmd::output(&mut b).with_context(|| format!("importing {} as {name}", tar.display()))?;
        println!("image: base image {name} from the cached root file system ({:.1} s)", t.elapsed().as_secs_f64());
    }
    Ok(name)
}

/// Removes the cached root file systems and base images of `name` made from other arguments (an
/// older list of packages), so the cache holds one of each.
fn forget_other_bases(buildah: &Buildah, work: &Path, name: &str, key: &str) {
    let prefix = format!("{name}-");
    if let Ok(entries) = fs::read_dir(work.join("base")) {
        for e in entries.flatten() {
            let file_name = e.file_name().to_string_lossy().into_owned();
            if let Some(other) = file_name.strip_prefix(&prefix)
                && other != key
            {
                let _ = fs::remove_dir_all(e.path());
                let _ = cmd::output(buildah.cmd().args(["rmi", &format!("localhost/gpu-tracer-base/{name}:{other}")]));
            }
        }
    }
}

/// `git rev-parse HEAD` (with `-dirty` when the tree has changes), or `unknown` outside git.
fn git_revision() -> String {
    let root = cmd::workspace_root();
    let Ok(head) = cmd::output(Command::new("git").arg("-C").arg(&root).args(["rev-parse", "HEAD"])) else {
        return "unknown".into();
    };
    let dirty =
        cmd::output(Command::new("git").arg("-C").arg(&root).args(["status", "--porcelain", "--untracked-files=no"]))
            .is_ok_and(|s| !s.trim().is_empty());
    format!("{}{}", head.trim(), if dirty { "-dirty" } else { "" })
}

/// The repository's URL for `org.opencontainers.image.source`, when it has an `origin` remote.
fn git_source() -> String {
    cmd::output(Command::new("git").arg("-C").arg(cmd::workspace_root()).args(["remote", "get-url", "origin"]))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// `buildah build` of the repository's Dockerfile with a context holding only the binary.
fn build(
    buildah: &Buildah,
    work: &Path,
    binary: &Path,
    strip_base: &str,
    runtime_base: &str,
    image: &str,
    version: &str,
) -> anyhow::Result<()> {
    let context = work.join("context");
    let _ = fs::remove_dir_all(&context);
    fs::create_dir_all(&context).with_context(|| format!("creating {}", context.display()))?;
    let packed = context.join("gpu-tracer");
    // A hard link costs nothing; a copy when the binary is on another file system.
    if fs::hard_link(binary, &packed).is_err() {
        fs::copy(binary, &packed).with_context(|| format!("copying {} to {}", binary.display(), packed.display()))?;
    }
    println!("image: buildah build (strip the binary, pack it on the runtime base; about 10 s)");
    let t = Instant::now();
    let mut b = buildah.cmd();
    b.args(["build", "--isolation", "chroot", "--pull=never", "--layers=false", "--force-rm", "--format", "oci"])
        .arg("-f")
        .arg(cmd::workspace_root().join("Dockerfile"))
        .args(["--build-arg", &format!("BASE={strip_base}")])
        .args(["--build-arg", &format!("RUNTIME_BASE={runtime_base}")])
        .args(["--build-arg", "BINARY=gpu-tracer"])
        .args(["--build-arg", &format!("VERSION={version}")])
        .args(["--build-arg", &format!("REVISION={}", git_revision())])
        .args(["--build-arg", &format!("SOURCE={}", git_source())])
        .args(["-t", image])
        .arg(&context);
    let result = cmd::run(&mut b);
    let _ = fs::remove_dir_all(&context);
    result.context("cause: the Dockerfile did not build (buildah's messages above say which step); fix: that step")?;
    println!("image: built {image} in {:.1} s", t.elapsed().as_secs_f64());
    Ok(())
}

struct Sizes {
    uncompressed: u64,
    archive: u64,
}

/// Runs the checks inside the image, then writes the archive.
fn check_and_write(
    buildah: &Buildah,
    image: &str,
    version_line: &str,
    archive: &Path,
    tag: &str,
) -> anyhow::Result<Sizes> {
    let config = cmd::output(buildah.cmd().args(["inspect", "--type", "image", image]))?;
    let config: serde_json::Value = serde_json::from_str(&config).context("parsing `buildah inspect` output")?;
    let oci = &config["OCIv1"]["config"];
    println!(
        "image: user {}, entrypoint {}, cmd {}, labels {}",
        oci["User"],
        oci["Entrypoint"],
        oci["Cmd"],
        serde_json::to_string(&oci["Labels"]).unwrap_or_default()
    );
    if oci["User"] != IMAGE_USER {
        bail!("cause: the image's user is {}, not {IMAGE_USER}; fix: the Dockerfile's USER", oci["User"]);
    }

    let id = cmd::output(buildah.cmd().args(["from", "--quiet", "--pull=never", image]))?.trim().to_string();
    let ctr = WorkingContainer { buildah, id };

    let t = Instant::now();
    let v = run_in(&ctr, &[], &["--version"])?;
    let inside = v.stdout.trim();
    println!("image: inside, as {IMAGE_USER}: gpu-tracer --version -> {inside} ({:.2} s)", t.elapsed().as_secs_f64());
    if v.code != Some(0) || inside != version_line {
        bail!(
            "cause: `gpu-tracer --version` inside the image said `{inside}` (exit {:?}; stderr: {}), the binary here \
             `{version_line}`; fix: rebuild the image from this binary",
            v.code,
            v.stderr.trim()
        );
    }

    doctor(&ctr, "as the image's default user 65532 (CLI use: `cost`, `api`, `--help`)", &[], &[])?;
    drop(ctr);
    // A second container for the DaemonSet's view: seccomp unconfined, because Debian 12's buildah
    // profile (containers-common 0.50) allows bpf() only with CAP_SYS_ADMIN, whereas the chart's
    // RuntimeDefault on containerd >= 1.7 allows it with CAP_BPF (values.yaml, seccompProfile).
    let id = cmd::output(buildah.cmd().args([
        "from",
        "--quiet",
        "--pull=never",
        "--security-opt",
        "seccomp=unconfined",
        image,
    ]))?
    .trim()
    .to_string();
    let ctr = WorkingContainer { buildah, id };
    let mut as_daemonset: Vec<String> = vec!["--user".into(), "0:0".into()];
    // `--cap-drop ALL` would drop the added ones too (buildah 1.28): drop buildah's defaults by name.
    for c in BUILDAH_DEFAULT_CAPS {
        as_daemonset.extend(["--cap-drop".into(), format!("CAP_{c}")]);
    }
    for c in DAEMONSET_CAPS {
        as_daemonset.extend(["--cap-add".into(), format!("CAP_{c}")]);
    }
    // The chart mounts the host's tracefs and its driver libraries (at /host/driver-lib) likewise.
    as_daemonset.extend(["--volume".into(), "/sys/kernel/tracing:/sys/kernel/tracing:ro".into()]);
    let mut doctor_args: Vec<String> = Vec::new();
    // Debian's libnvidia-ml.so.1 is a link through /etc/alternatives: mount the file it names.
    if let Ok(nvml) = fs::canonicalize(HOST_NVML) {
        as_daemonset.extend(["--volume".into(), format!("{}:/host/driver-lib/libnvidia-ml.so.1:ro", nvml.display())]);
        doctor_args = vec!["--nvml-library".into(), "/host/driver-lib/libnvidia-ml.so.1".into()];
    }
    let as_daemonset: Vec<&str> = as_daemonset.iter().map(String::as_str).collect();
    let doctor_args: Vec<&str> = doctor_args.iter().map(String::as_str).collect();
    let how = format!(
        "as the chart's DaemonSet runs it (uid 0, capabilities {}, the host's tracefs{})",
        DAEMONSET_CAPS.join(" "),
        if doctor_args.is_empty() { "" } else { " and NVML" }
    );
    let report = doctor(&ctr, &how, &as_daemonset, &doctor_args)?;
    let want = DAEMONSET_CAPS.iter().map(|c| format!("CAP_{c}")).collect::<Vec<_>>().join(", ");
    if !report.lines().any(|l| l.starts_with("ok    capabilities ") && l.ends_with(&format!(": {want}"))) {
        bail!(
            "cause: inside the image as uid 0 the capabilities were not exactly {want} (see the report's `capabilities` \
             line); fix: check buildah's --cap-drop/--cap-add handling (BUILDAH_DEFAULT_CAPS in xtask/src/image.rs)"
        );
    }
    drop(ctr);

    let _ = fs::remove_file(archive);
    println!("image: writing {}", archive.display());
    let t = Instant::now();
    let dest = format!("oci-archive:{}:{ARCHIVE_NAME}:{tag}", archive.display());
    cmd::output(buildah.cmd().args(["push", "--quiet", image, &dest]))?;
    let archive_size = fs::metadata(archive)?.len();
    println!("image: written in {:.1} s", t.elapsed().as_secs_f64());
    let uncompressed = uncompressed_size(archive, &archive.with_extension("unpacked"))?;
    Ok(Sizes { uncompressed, archive: archive_size })
}

/// `buildah run` in `ctr` with `run_args` (user, capabilities, mounts), then `gpu-tracer ARGS`.
fn run_in(ctr: &WorkingContainer, run_args: &[&str], args: &[&str]) -> anyhow::Result<RunOutput> {
    let mut c = ctr.buildah.cmd();
    c.arg("run").args(run_args).arg(&ctr.id).arg("--").arg("/usr/local/bin/gpu-tracer").args(args);
    let line = cmd::display(&c);
    let out = c.output().with_context(|| format!("could not start `{line}`"))?;
    Ok(RunOutput {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// `gpu-tracer doctor` inside the image: it must run and print its report. Its exit status is 1
/// when a check says `fail` (here: no GPU driver, and no privileges as 65532), 0 otherwise.
fn doctor(ctr: &WorkingContainer, how: &str, run_args: &[&str], extra: &[&str]) -> anyhow::Result<String> {
    let t = Instant::now();
    let mut args = extra.to_vec();
    args.push("doctor");
    let out = run_in(ctr, run_args, &args)?;
    println!(
        "image: inside, {how}: gpu-tracer doctor (exit {}; 1 = some check says fail, {:.1} s):",
        out.code.map_or("none".into(), |c| c.to_string()),
        t.elapsed().as_secs_f64()
    );
    for l in out.stdout.lines() {
        println!("  | {l}");
    }
    let report = out.stdout.lines().any(|l| l.starts_with("ok    config ") || l.starts_with("fail  config "));
    if !report || !matches!(out.code, Some(0 | 1)) {
        bail!(
            "cause: `gpu-tracer doctor` inside the image printed no report (exit {:?}); its stderr: {}; fix: what \
             that says (a missing library in the runtime base shows as `error while loading shared libraries`)",
            out.code,
            out.stderr.trim()
        );
    }
    Ok(out.stdout)
}

/// The image's size uncompressed: its layers' tars, ungzipped from the archive (what `docker
/// images` shows, near enough). `scratch` is a directory to unpack into, removed after.
fn uncompressed_size(archive: &Path, scratch: &Path) -> anyhow::Result<u64> {
    let _ = fs::remove_dir_all(scratch);
    fs::create_dir_all(scratch).with_context(|| format!("creating {}", scratch.display()))?;
    let result = (|| {
        cmd::output(Command::new("tar").arg("-xf").arg(archive).arg("-C").arg(scratch))?;
        let blob = |digest: &str| scratch.join("blobs").join(digest.replace(':', "/"));
        let json = |p: PathBuf| -> anyhow::Result<serde_json::Value> {
            let text = fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
            serde_json::from_str(&text).with_context(|| format!("parsing {}", p.display()))
        };
        let index = json(scratch.join("index.json"))?;
        let manifest = json(blob(index["manifests"][0]["digest"].as_str().context("index.json names no manifest")?))?;
        let mut total = 0;
        for layer in manifest["layers"].as_array().context("the manifest lists no layers")? {
            let path = blob(layer["digest"].as_str().context("a layer without a digest")?);
            let mut gz = Command::new("gzip")
                .arg("-dc")
                .arg(&path)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .context("could not start gzip")?;
            total += std::io::copy(gz.stdout.as_mut().expect("piped"), &mut std::io::sink())?;
            if !gz.wait()?.success() {
                bail!("gzip -dc {} failed", path.display());
            }
        }
        Ok(total)
    })();
    let _ = fs::remove_dir_all(scratch);
    result
}

fn print_how_to_use(archive: &Path, tag: &str) {
    let a = archive.display();
    println!(
        "\nThe archive names the image {ARCHIVE_NAME}:{tag}, which is what the chart's default `gpu-tracer:{tag}` \
         means to the kubelet. Load it on every node that runs the agent:\n\
         \x20 containerd (most clusters):  ctr -n k8s.io images import {a}\n\
         \x20 kind:                        kind load image-archive {a}\n\
         \x20 CRI-O, podman:               podman load -i {a}\n\
         \x20 Docker:                      skopeo copy oci-archive:{a} docker-daemon:gpu-tracer:{tag}\n\
         \x20 a registry:                  skopeo copy oci-archive:{a} docker://REGISTRY/gpu-tracer:{tag}\n\
         Then install the chart with it (pullPolicy Never: the kubelet must not look for it in a registry):\n\
         \x20 helm install gpu-tracer deploy/helm/gpu-tracer --namespace gpu-tracer --create-namespace \\\n\
         \x20   --set image.repository=gpu-tracer,image.tag={tag},image.pullPolicy=Never\n\
         (from a registry: --set image.repository=REGISTRY/gpu-tracer,image.tag={tag}). docs/image.md has the details."
    );
}
