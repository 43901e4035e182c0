//! `cargo xtask kmod`: the kernel-module double of the NVIDIA driver (`tests/kmod`: `nvidia.ko`,
//! `nvidia-uvm.ko`) built for a kernel `cargo xtask kernel-matrix` boots: Debian's 6.1 by default,
//! Debian 11's 5.10 with `--kernel 5.10`.
//!
//! The headers come from Debian's own packages, not from this machine (whose kernel is another):
//! `linux-headers-<version>`, and what it depends on, `linux-headers-<abi>-common` and
//! `linux-kbuild-<major.minor>`, fetched with `apt-get download` (for another Debian release
//! through a private apt configuration, [`setup::PrivateApt`]) and unpacked with `dpkg-deb -x`
//! into a private root, [`kernel_matrix::CACHE`]`/headers-<version>/`. Their layout is kept as the
//! packages lay it out (the relative `scripts` and `tools` links resolve inside that root); the
//! one absolute path, the flavour Makefile's `include /usr/src/linux-headers-<abi>-common/Makefile`,
//! is pointed into the root. Kbuild then builds with the compiler the kernel was built with
//! (`CC = gcc-12` in that Makefile, `gcc-10` for 5.10), refused when its version differs from the
//! headers' `CONFIG_CC_VERSION_TEXT`: this machine's `gcc-12` for 6.1; for another release, that
//! release's own compiler (`gcc-10`, `cpp-10`, `libgcc-10-dev` of bullseye) unpacked into
//! [`kernel_matrix::CACHE`]`/toolchain-<suite>/` and put first on make's `PATH` (gcc finds its
//! `cc1` and headers relative to itself; the assembler and linker are this machine's binutils).
//!
//! Module BTF, as Debian's own modules have it (`CONFIG_DEBUG_INFO_BTF_MODULES`, 5.11 and later),
//! so that driver-entry mode can use fentry/fexit on the double: Kbuild encodes it with pahole
//! against the kernel's `vmlinux`, which no headers package ships, so it skips that step; it is
//! done here instead, `pahole -J --btf_base` against the `vmlinux` in the guest's own `vmlinuz`
//! (its `.BTF` section is the running kernel's, so the type ids agree). The modules without BTF
//! (what NVIDIA's DKMS builds usually are, and all a 5.10 kernel can load) are kept beside them,
//! for the kprobe fallback's tests. A kernel without module BTF gets only those.
//!
//! Output: `target/kmod/<version>/{nvidia,nvidia-uvm}.ko` (with BTF) and `…/no-btf/` (without),
//! rebuilt only when the sources, the headers, the compiler or pahole changed (a stamp beside them
//! says which). The build happens in a copy of the sources, `target/kmod/build/`, so the source tree
//! never holds build products.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, anyhow, bail};

use crate::kernel_matrix::{self, Release};
use crate::{cmd, setup};

/// The modules built, as `make` names them.
pub const MODULES: &[&str] = &["nvidia.ko", "nvidia-uvm.ko"];

/// `cargo xtask kmod`.
pub fn run(release: Release) -> anyhow::Result<()> {
    setup::run_setup()?;
    let (version, vmlinuz) = kernel_matrix::x86_64_kernel(release)
        .context("cause: could not find which kernel the guest boots; fix: `apt-get update`, then rerun")?;
    let dir = build(release, &version, &vmlinuz)?;
    println!("kmod: {} in {}", MODULES.join(" and "), dir.display());
    Ok(())
}

/// Builds the modules for the guest kernel `version` of `release` (booted from `vmlinuz`) if
/// anything changed, and returns their directory.
pub fn build(release: Release, version: &str, vmlinuz: &Path) -> anyhow::Result<PathBuf> {
    let mut apt = None;
    let headers = headers(release, version, &mut apt)?;
    let compiler = compiler(release, &headers, &mut apt)?;
    let config = std::fs::read_to_string(headers.join(".config"))
        .with_context(|| format!("reading {}/.config", headers.display()))?;
    // 5.10 has no module BTF (CONFIG_DEBUG_INFO_BTF_MODULES appeared in 5.11): only the build
    // without it is made there.
    let module_btf = config_value(&config, "CONFIG_DEBUG_INFO_BTF_MODULES").as_deref() == Some("y");
    let mut tools = format!("{}\nmodule BTF {module_btf}", compiler.version);
    if module_btf {
        let pahole = cmd::output(Command::new("pahole").arg("--version")).map_err(|e| {
            anyhow!("{e:#}; cause: pahole encodes the modules' BTF; fix: `cargo xtask setup` (installs dwarves)")
        })?;
        let _ = write!(tools, "\npahole {}", pahole.trim());
    }

    let src = cmd::workspace_root().join("tests/kmod");
    let out = cmd::workspace_root().join("target/kmod").join(version);
    let stamp_path = out.join(".stamp");
    let stamp = stamp(&src, version, &tools)?;
    if std::fs::read_to_string(&stamp_path).is_ok_and(|s| s == stamp)
        && MODULES.iter().all(|m| (!module_btf || out.join(m).is_file()) && out.join(NO_BTF).join(m).is_file())
    {
        println!("kmod: {} for {version} up to date", MODULES.join(", "));
        return Ok(out);
    }

    let work = cmd::workspace_root().join("target/kmod/build");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    for f in sources(&src)? {
        std::fs::copy(&f, work.join(f.file_name().expect("a file")))
            .with_context(|| format!("copying {}", f.display()))?;
    }
    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut make = Command::new("make");
    if let Some(bin) = &compiler.bin {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut dirs = vec![bin.clone()];
        dirs.extend(std::env::split_paths(&path));
        make.env("PATH", std::env::join_paths(dirs)?);
    }
    cmd::run(
        make.arg("-C")
            .arg(&headers)
            .arg(format!("M={}", work.display()))
            .arg(format!("-j{jobs}"))
            .arg("modules")
            // Kbuild reads these from the environment; none of this machine's must leak in.
            .env_remove("ARCH")
            .env_remove("CROSS_COMPILE")
            .env_remove("KBUILD_OUTPUT"),
    )
    .map_err(|e| {
        anyhow!(
            "{e:#}; cause: the module sources in {} do not build (see above), or make is missing \
             (`cargo xtask setup` installs it)",
            src.display()
        )
    })?;

    let no_btf = out.join(NO_BTF);
    std::fs::create_dir_all(&no_btf).with_context(|| format!("creating {}", no_btf.display()))?;
    let vmlinux = if module_btf { Some(vmlinux(version, vmlinuz)?) } else { None };
    for m in MODULES {
        std::fs::copy(work.join(m), no_btf.join(m))
            .with_context(|| format!("cause: make did not produce {m} in {}", work.display()))?;
        let _ = std::fs::remove_file(out.join(m));
        if let Some(vmlinux) = &vmlinux {
            cmd::run(Command::new("pahole").arg("-J").arg("--btf_base").arg(vmlinux).arg(work.join(m)))
                .map_err(|e| anyhow!("{e:#}; cause: pahole could not encode {m}'s BTF"))?;
            std::fs::copy(work.join(m), out.join(m))?;
        }
    }
    if vmlinux.is_none() {
        println!("kmod: {version} has no module BTF (CONFIG_DEBUG_INFO_BTF_MODULES, 5.11+): built without it only");
    }
    std::fs::write(&stamp_path, stamp)?;
    Ok(out)
}

/// The directory under `target/kmod/<version>/` with the modules as Kbuild left them (no BTF).
pub const NO_BTF: &str = "no-btf";

/// The guest kernel's `vmlinux` (an ELF with its `.BTF` section), decompressed once from its
/// `vmlinuz` (an xz stream inside the bzImage) into the cache.
fn vmlinux(version: &str, vmlinuz: &Path) -> anyhow::Result<PathBuf> {
    let out = Path::new(kernel_matrix::CACHE).join(format!("vmlinux-{version}"));
    if out.is_file() {
        return Ok(out);
    }
    let image = std::fs::read(vmlinuz).with_context(|| format!("reading {}", vmlinuz.display()))?;
    let at = image
        .windows(6)
        .position(|w| w == b"\xfd7zXZ\0")
        .ok_or_else(|| anyhow!("cause: {} holds no xz stream (not CONFIG_KERNEL_XZ?)", vmlinuz.display()))?;
    let tmp = out.with_extension("part");
    let file = std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let mut child = Command::new("xz")
        .args(["-dc", "--single-stream"])
        .stdin(std::process::Stdio::piped())
        .stdout(file)
        .spawn()
        .context("running xz (xz-utils)")?;
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().expect("piped");
        // `--single-stream` stops reading at the stream's end; the bzImage's tail is not read.
        match stdin.write_all(&image[at..]) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            r => r.context("feeding xz")?,
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("cause: xz could not decompress the kernel in {} ({status})", vmlinuz.display());
    }
    std::fs::rename(&tmp, &out)?;
    Ok(out)
}

/// The unpacked headers' build directory (`.../usr/src/linux-headers-<version>`), downloading and
/// unpacking the three packages the first time (for a release other than this machine's through
/// `apt`, a private apt configuration made once when first needed).
fn headers(release: Release, version: &str, apt: &mut Option<setup::PrivateApt>) -> anyhow::Result<PathBuf> {
    let root = Path::new(kernel_matrix::CACHE).join(format!("headers-{version}"));
    let build_dir = root.join("usr/src").join(format!("linux-headers-{version}"));
    let done = root.join(".unpacked");
    if done.is_file() {
        return Ok(build_dir);
    }
    let _ = std::fs::remove_dir_all(&root);
    let flavour = format!("linux-headers-{version}");
    let mut packages = vec![flavour.clone()];
    let apt = private_apt(release, apt)?;
    for prefix in ["linux-headers-", "linux-kbuild-"] {
        packages.push(match apt {
            Some(apt) => apt.dependency(&flavour, prefix)?,
            None => kernel_matrix::apt_dependency(&flavour, prefix)?,
        });
    }
    for p in &packages {
        match apt {
            Some(apt) => apt.unpack(p, &root),
            None => kernel_matrix::download_and_unpack(p, &root),
        }
        .with_context(|| format!("cause: could not fetch {p} (cargo xtask kmod needs the headers of {version})"))?;
    }
    // The flavour's Makefile includes the common one by its absolute installed path.
    let makefile = build_dir.join("Makefile");
    let text = std::fs::read_to_string(&makefile).with_context(|| format!("reading {}", makefile.display()))?;
    let fixed = text.replace("include /usr/src/", &format!("include {}/usr/src/", root.display()));
    if fixed == text {
        bail!("cause: {} has no `include /usr/src/...` line to point into {}", makefile.display(), root.display());
    }
    std::fs::write(&makefile, fixed)?;
    std::fs::write(&done, packages.join("\n") + "\n")?;
    Ok(build_dir)
}

/// The private apt configuration of `release` (made on first use), or `None` for this machine's own.
fn private_apt(release: Release, apt: &mut Option<setup::PrivateApt>) -> anyhow::Result<Option<&setup::PrivateApt>> {
    if release == Release::Bookworm {
        return Ok(None);
    }
    if apt.is_none() {
        *apt = Some(setup::PrivateApt::suite(release.suite())?);
    }
    Ok(apt.as_ref())
}

/// The compiler Kbuild runs: what it says of itself, and the directory to put first on make's
/// `PATH` (`None`: this machine's).
struct Compiler {
    version: String,
    bin: Option<PathBuf>,
}

/// The headers' compiler (`CONFIG_CC_VERSION_TEXT`, e.g. `gcc-12 (Debian 12.2.0-14+deb12u1)
/// 12.2.0`) in the same version: this machine's, or for another Debian release that release's own,
/// unpacked into the cache once.
fn compiler(release: Release, headers: &Path, apt: &mut Option<setup::PrivateApt>) -> anyhow::Result<Compiler> {
    let config = std::fs::read_to_string(headers.join(".config"))
        .with_context(|| format!("reading {}/.config", headers.display()))?;
    let want = config_value(&config, "CONFIG_CC_VERSION_TEXT")
        .ok_or_else(|| anyhow!("cause: {}/.config has no CONFIG_CC_VERSION_TEXT", headers.display()))?;
    let program = want.split_whitespace().next().unwrap_or("gcc").to_string();
    if release == Release::Bookworm {
        let have = check_compiler(&want, Path::new(&program), release)?;
        return Ok(Compiler { version: have, bin: None });
    }
    let root = Path::new(kernel_matrix::CACHE).join(format!("toolchain-{}", release.suite()));
    let bin = root.join("usr/bin");
    let done = root.join(".unpacked");
    if !done.is_file() {
        let major = program
            .strip_prefix("gcc-")
            .ok_or_else(|| anyhow!("cause: the kernel was built with `{want}`, not a Debian gcc-N"))?;
        let _ = std::fs::remove_dir_all(&root);
        let packages = [program.clone(), format!("cpp-{major}"), format!("libgcc-{major}-dev")];
        let apt = private_apt(release, apt)?.expect("not this machine's release");
        for p in &packages {
            apt.unpack(p, &root).with_context(|| {
                format!("cause: could not fetch {p} of {} (the compiler of its kernel)", release.suite())
            })?;
        }
        std::fs::write(&done, packages.join("\n") + "\n")?;
    }
    let have = check_compiler(&want, &bin.join(&program), release)?;
    Ok(Compiler { version: have, bin: Some(bin) })
}

/// `compiler --version` must be `want`'s version; returns its first line.
fn check_compiler(want: &str, compiler: &Path, release: Release) -> anyhow::Result<String> {
    let program = compiler.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    let have = cmd::output(Command::new(compiler).arg("--version"))
        .map_err(|e| {
            anyhow!(
                "{e:#}; cause: the kernel was built with `{want}`; fix: `cargo xtask setup` (installs {program}), or \
                 remove {}/toolchain-{} to fetch it again",
                kernel_matrix::CACHE,
                release.suite()
            )
        })?
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    let version = |s: &str| s.split_whitespace().last().unwrap_or_default().to_string();
    if version(&have) != version(want) {
        bail!(
            "cause: the kernel was built with `{want}`, {} is `{have}`; a module built with another compiler \
             version may not load or may crash; fix: install the {program} of Debian's {}",
            compiler.display(),
            release.suite()
        );
    }
    if have != want {
        println!("kmod: note: the kernel was built with `{want}`, building with `{have}` (same version)");
    }
    Ok(have)
}

/// The value of `KEY="value"` in a kernel `.config`.
fn config_value(config: &str, key: &str) -> Option<String> {
    config.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix('=')).map(|v| v.trim_matches('"').to_string())
}

/// The module sources: the plain files of `tests/kmod`, sorted.
fn sources(src: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(src)
        .with_context(|| format!("listing {}", src.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    Ok(files)
}

/// What the built modules depend on: the kernel version, the compiler, every source file's name
/// and contents (FNV-1a, stable across toolchains, unlike `DefaultHasher`).
fn stamp(src: &Path, version: &str, tools: &str) -> anyhow::Result<String> {
    let mut s = format!("kernel {version}\ncompiler {tools}\n");
    for f in sources(src)? {
        let bytes = std::fs::read(&f).with_context(|| format!("reading {}", f.display()))?;
        let _ = writeln!(s, "{} {:016x}", f.file_name().expect("a file").to_string_lossy(), fnv1a(&bytes));
    }
    Ok(s)
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_compiler_from_the_kernel_config() {
        let config = "CONFIG_CC_VERSION_TEXT=\"gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0\"\nCONFIG_GCC_VERSION=120200\n";
        assert_eq!(
            config_value(config, "CONFIG_CC_VERSION_TEXT").as_deref(),
            Some("gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0")
        );
        assert_eq!(config_value(config, "CONFIG_GCC_VERSION").as_deref(), Some("120200"));
        assert_eq!(config_value(config, "CONFIG_CC"), None);
    }

    #[test]
    fn the_stamp_changes_with_any_source() {
        let dir = std::env::temp_dir().join(format!("xtask-kmod-stamp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a.c"), "int a;").unwrap();
        let one = stamp(&dir, "6.1.0-57-amd64", "gcc-12 12.2.0").unwrap();
        assert_eq!(one, stamp(&dir, "6.1.0-57-amd64", "gcc-12 12.2.0").unwrap());
        std::fs::write(dir.join("a.c"), "int b;").unwrap();
        let two = stamp(&dir, "6.1.0-57-amd64", "gcc-12 12.2.0").unwrap();
        assert_ne!(one, two);
        assert_ne!(two, stamp(&dir, "6.1.0-58-amd64", "gcc-12 12.2.0").unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn fnv1a_matches_the_reference_values() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
