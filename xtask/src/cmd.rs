//! Running commands: echoed, with errors that name the command and its exit status.

use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The workspace root (the parent of this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace root").to_path_buf()
}

/// `$CARGO_HOME`, or `$HOME/.cargo` as rustup and cargo default it.
pub fn cargo_home() -> PathBuf {
    match std::env::var_os("CARGO_HOME") {
        Some(h) if !h.is_empty() => PathBuf::from(h),
        _ => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cargo"),
    }
}

/// The cargo that runs xtask (`$CARGO`, set by `cargo run`), so nested builds use the same toolchain.
pub fn cargo_program() -> PathBuf {
    std::env::var_os("CARGO").map(PathBuf::from).unwrap_or_else(|| "cargo".into())
}

/// A command line as one could paste it into a shell (no quoting; for messages only).
pub fn display(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs `cmd` with inherited stdio, echoing it first; fails unless it exits 0.
pub fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let line = display(cmd);
    // stdout, like the setup lines, so the two stay in order in a log.
    println!("+ {line}");
    let status = cmd.status().with_context(|| format!("could not start `{line}`"))?;
    if !status.success() {
        bail!("`{line}` failed ({status})");
    }
    Ok(())
}

/// Runs `cmd` quietly and returns its stdout; fails (with its stderr) unless it exits 0.
pub fn output(cmd: &mut Command) -> anyhow::Result<String> {
    let line = display(cmd);
    let out = cmd.stdin(Stdio::null()).output().with_context(|| format!("could not start `{line}`"))?;
    if !out.status.success() {
        bail!("`{line}` failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether this process runs as root (needed to mount tracefs and to install packages).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}
