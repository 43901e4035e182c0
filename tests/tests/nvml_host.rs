//! NVML must not change the host (issue 13, item 7). On a node without the NVIDIA kernel module,
//! NVIDIA's real `libnvidia-ml.so.1` (Debian's libnvidia-ml1, `cargo xtask setup`) run as root
//! creates `/dev/nvidiactl` (c 195:255, mode 0666) in `nvmlInit`; `gpu-tracer` must not call it there.
//!
//! Every run is in a private mount namespace (`unshare --mount`) whose `/dev` is an empty tmpfs, so
//! the test makes its own conditions (this machine may already have a `/dev/nvidiactl` from an
//! earlier run) and the host's `/dev` is never touched. The control, the real library's `nvmlInit_v2`
//! called directly (python3's ctypes), shows that the setup sees the node being created. Needs root
//! and a node without the NVIDIA driver; fails (never skips) otherwise.
use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

use gpu_tracer_tests::{gpu_tracer, require_root};

/// Where Debian's libnvidia-ml1 puts the real library.
const REAL_NVML: &str = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1";

/// The reason the agent gives, in the log, `doctor` and the snapshot.
const NOT_INITIALISED: &str = "NVML not initialised: the NVIDIA driver is not loaded (/proc/driver/nvidia missing); \
                               initialising it would create /dev/nvidiactl";

/// Root, the real library, no NVIDIA driver, and util-linux's `unshare`.
fn preconditions() {
    require_root();
    assert!(
        Path::new(REAL_NVML).exists(),
        "{REAL_NVML} is missing: `cargo xtask setup` installs Debian's libnvidia-ml1"
    );
    assert!(
        !Path::new("/proc/driver/nvidia").exists(),
        "this test is for a node without the NVIDIA driver (/proc/driver/nvidia exists)"
    );
    let unshare = Command::new("unshare").arg("--version").stdout(Stdio::null()).status();
    assert!(unshare.as_ref().is_ok_and(|s| s.success()), "util-linux `unshare` is needed: {unshare:?}");
}

/// Run `gpu-tracer <args>` in a private mount namespace whose `/dev` is a fresh, empty tmpfs; its
/// output, and what is in that `/dev` after it exited.
fn in_private_dev(args: &[&str]) -> (Output, Vec<String>) {
    in_private_dev_running(gpu_tracer().as_os_str(), args)
}

/// [`in_private_dev`] for any program.
fn in_private_dev_running(program: &std::ffi::OsStr, args: &[&str]) -> (Output, Vec<String>) {
    let dir = tempfile_dir();
    let listing = dir.join("dev-after");
    // The mount namespace is private (util-linux's default propagation), so the tmpfs on /dev is
    // seen by nothing outside, and goes away with the last process in it.
    let script = r#"
        out=$1; shift
        mount -t tmpfs -o mode=0755,size=1m gpu-tracer-test-dev /dev || exit 97
        "$@"
        rc=$?
        ls -A /dev > "$out" || exit 98
        exit $rc
    "#;
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "sh", "-c", script, "sh"])
        .arg(&listing)
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run unshare");
    let code = out.status.code();
    assert!(code != Some(97) && code != Some(98), "namespace setup failed: {}", String::from_utf8_lossy(&out.stderr));
    let files = std::fs::read_to_string(&listing).unwrap_or_else(|e| panic!("{}: {e}", listing.display()));
    let _ = std::fs::remove_dir_all(&dir);
    (out, files.lines().map(str::to_owned).collect())
}

fn tempfile_dir() -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!(
        "gpu-tracer-nvml-host.{}.{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `doctor --json`'s check called `name`: (status, detail).
fn check(out: &Output, name: &str) -> (String, String) {
    let text = String::from_utf8_lossy(&out.stdout);
    let report: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("doctor --json: {e}: {text}\n{}", stderr(out)));
    let c = report["checks"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no {name:?} check in {text}"));
    (c["status"].as_str().unwrap_or_default().to_owned(), c["detail"].as_str().unwrap_or_default().to_owned())
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `doctor` and a short agent run with `--nvml auto`, with NVML found by the loader's search and
/// with the library named explicitly (as the DaemonSet does), leave `/dev` empty and say why NVML
/// is not used; `--nvml required` is an error with that reason. So does the test-double switch
/// (`--simulated-devices` with an explicit `--nvml-library`) when the library is NVIDIA's and not
/// the double (issue 45 item 6: it initialised any library; `doctor`, `agent` and `top` made
/// /dev/nvidiactl). The control: the real library's nvmlInit_v2, called directly in the same setup,
/// creates `/dev/nvidiactl`.
#[test]
fn nvml_without_the_driver_creates_no_device_node() {
    preconditions();
    // No probes: only NVML is under test, and nothing competes with the other root tests' probes.
    let doctor = ["--nvml-only", "--nvml", "auto", "doctor", "--json"];

    // Control: NVIDIA's nvmlInit_v2 as root, without the driver.
    let call = format!("import ctypes; print(ctypes.CDLL({REAL_NVML:?}).nvmlInit_v2())");
    let (out, dev) = in_private_dev_running("python3".as_ref(), &["-c", &call]);
    println!("reliability: control_created={dev:?}");
    // (python3 also makes /dev/null in the empty /dev.)
    assert!(
        dev.iter().any(|d| d == "nvidiactl"),
        "the real nvmlInit as root creates /dev/nvidiactl here: {dev:?} {}",
        stderr(&out)
    );

    // The test-double switch with NVIDIA's library: not the double, so the driver rule holds.
    let simulated = ["--simulated-devices", "--nvml-library", REAL_NVML];
    let (out, dev) = in_private_dev(&[&simulated[..], &doctor].concat());
    println!("reliability: simulated_devices_real_library_created={}", dev.len());
    assert!(dev.is_empty(), "--simulated-devices with NVIDIA's library created {dev:?}: {}", stderr(&out));
    let (status, detail) = check(&out, "nvml");
    assert_eq!(status, "warn", "{detail}");
    assert!(detail.starts_with(NOT_INITIALISED), "{detail}");
    for cmd in
        [&["agent", "--duration", "2", "--listen", "127.0.0.1:0", "--grpc-listen", "off"][..], &["top", "--once"]]
    {
        let (out, dev) = in_private_dev(&[&["--log", "info", "--nvml-only"][..], &simulated, cmd].concat());
        assert!(
            dev.is_empty(),
            "{cmd:?} with --simulated-devices and NVIDIA's library created {dev:?}: {}",
            stderr(&out)
        );
        if cmd[0] == "agent" {
            assert!(stderr(&out).contains(NOT_INITIALISED), "the agent says why: {}", stderr(&out));
        }
    }

    for explicit in [&[][..], &["--nvml-library", REAL_NVML][..]] {
        let (out, dev) = in_private_dev(&[explicit, &doctor].concat());
        println!(
            "reliability: doctor{}_created={}",
            if explicit.is_empty() { "" } else { "_explicit_library" },
            dev.len()
        );
        assert!(dev.is_empty(), "doctor {explicit:?} created {dev:?} in /dev: {}", stderr(&out));
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let (status, detail) = check(&out, "nvml");
        assert_eq!(status, "warn", "{detail}");
        assert!(detail.starts_with(NOT_INITIALISED), "{detail}");
        assert!(detail.contains("modprobe nvidia") && detail.contains("nvml.mode"), "names the fix: {detail}");
    }

    let agent = ["--log", "info", "--nvml-only", "agent", "--duration", "2", "--listen", "127.0.0.1:0"];
    let (out, dev) = in_private_dev(&[&agent[..], &["--grpc-listen", "off"]].concat());
    println!("reliability: agent_created={}", dev.len());
    assert!(dev.is_empty(), "the agent created {dev:?} in /dev: {}", stderr(&out));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains(NOT_INITIALISED), "{}", stderr(&out));

    let (out, dev) = in_private_dev(&["--nvml-only", "--nvml", "required", "doctor", "--json"]);
    println!("reliability: nvml_required_created={}", dev.len());
    assert!(dev.is_empty(), "doctor --nvml required created {dev:?} in /dev: {}", stderr(&out));
    let (status, detail) = check(&out, "probes");
    assert_eq!(status, "fail", "{detail}");
    assert!(detail.contains("NVML is required") && detail.contains(NOT_INITIALISED), "{detail}");
}
