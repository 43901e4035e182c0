//! The NVML sampler through nvml-wrapper against the fake `libnvidia-ml.so.1` (tests/fake-nvml), one
//! private copy per test, and against the real library from Debian's `libnvidia-ml1` on a machine
//! without the NVIDIA kernel module. No root needed.
use std::path::{Path, PathBuf};

use fake_nvml::{Device, MigInstance, Process, Scenario, UtilizationSample, abi};
use tracer_agent::nvml::sampler::{NvmlOpen, NvmlOpenError, NvmlSource};
use tracer_core::config::{Config, NvmlSettings, SourceMode};
use tracer_core::nvml::model::{
    Clocks, ComputeMode, DeviceSample, GpuProcess, MemoryInfo, Missing, ProcessUtilization, Utilization,
};

const GIB: u64 = 1 << 30;

/// `nvml` on simulated devices: the fake has no NVIDIA kernel module behind it, and NVML is not
/// initialised without one unless the library is explicit and the devices simulated.
fn fake(nvml: NvmlSettings) -> Config {
    Config { nvml, simulated_devices: true, ..Config::default() }
}

fn required(lib: &Path) -> Config {
    fake(NvmlSettings { mode: SourceMode::Required, library: Some(lib.to_path_buf()) })
}

/// A fresh fake with `scenario`, opened in `required` mode.
fn open(scenario: &Scenario) -> (tempfile::TempDir, NvmlSource) {
    let dir = tempfile::tempdir().expect("temp dir");
    let lib = fake_nvml::install(dir.path(), scenario).expect("install the fake NVML");
    let source = NvmlSource::open(&required(&lib)).expect("open the fake NVML").into_source().expect("ready");
    (dir, source)
}

fn h100(uuid: &str, minor: u32, bus: &str) -> Device {
    Device::new(uuid)
        .name("NVIDIA H100 80GB HBM3")
        .minor(minor)
        .pci_bus_id(bus)
        .memory(80 * GIB, GIB / 2, 30 * GIB)
        .utilization(70, 40)
        .power_mw(350_000)
        .energy_mj(9_000_000)
        .clocks(1980, 1980, 2619)
        .temperature_c(61)
        .compute_mode(fake_nvml::ComputeMode::Default)
        .mig_mode(false, false)
        .compute_processes(vec![Process::new(4242, 20 * GIB)])
        .graphics_processes(vec![])
        .mps_processes(vec![])
        .process_utilization(vec![UtilizationSample::new(4242, 1_000, 65, 30, 0, 0)])
}

fn two_gpus() -> Scenario {
    Scenario::new("550.54.15")
        .nvml_version("12.550.54.15")
        .cuda_driver_version(12040)
        .device(h100("GPU-aaaaaaaa-0000-0000-0000-000000000000", 0, "00000000:3B:00.0"))
        .device(
            Device::new("GPU-bbbbbbbb-0000-0000-0000-000000000000")
                .name("NVIDIA L4")
                .minor(1)
                .pci_bus_id("00000000:5E:00.0")
                .memory(24 * GIB, 300 << 20, 300 << 20)
                .utilization(0, 0)
                .power_mw(16_000)
                .compute_mode(fake_nvml::ComputeMode::ExclusiveProcess)
                .compute_processes(vec![]),
        )
}

fn missing(what: &str, reason: &str) -> Missing {
    Missing { what: what.into(), reason: reason.into() }
}

#[test]
fn two_gpus_read_field_by_field() {
    let (_dir, mut source) = open(&two_gpus());
    let sample = source.sample();
    assert_eq!(sample.driver_version.as_deref(), Some("550.54.15"));
    assert_eq!(sample.nvml_version.as_deref(), Some("12.550.54.15"));
    assert_eq!(sample.cuda_driver_version, Some(12040));
    assert!(sample.missing.is_empty(), "{:?}", sample.missing);
    assert!(sample.cost_ns > 0);
    assert!(sample.taken_unix_ns > 0 && sample.taken_mono_ns > 0);
    assert_eq!(sample.devices.len(), 2);

    let expected0 = DeviceSample {
        index: 0,
        uuid: "GPU-aaaaaaaa-0000-0000-0000-000000000000".into(),
        name: Some("NVIDIA H100 80GB HBM3".into()),
        minor: Some(0),
        pci_bus_id: Some("00000000:3B:00.0".into()),
        memory: Some(MemoryInfo { total: 80 * GIB, reserved: GIB / 2, free: 50 * GIB, used: 30 * GIB }),
        utilization: Some(Utilization { gpu_pct: 70, memory_pct: 40 }),
        power_mw: Some(350_000),
        energy_mj: Some(9_000_000),
        clocks: Clocks { graphics_mhz: Some(1980), sm_mhz: Some(1980), memory_mhz: Some(2619) },
        temperature_c: Some(61),
        compute_mode: Some(ComputeMode::Default),
        mig_enabled: Some(false),
        mig_instances: vec![],
        processes: vec![GpuProcess { pid: 4242, used_bytes: Some(20 * GIB), compute: true, ..Default::default() }],
        process_utilization: vec![ProcessUtilization {
            pid: 4242,
            timestamp_us: 1_000,
            sm_pct: 65,
            mem_pct: 30,
            enc_pct: 0,
            dec_pct: 0,
        }],
        lost: false,
        missing: vec![],
    };
    assert_eq!(sample.devices[0], expected0);

    // The L4 lacks energy, clocks, temperature, MIG, the graphics/MPS lists and process utilization:
    // each is absent and says NotSupported, none is an error.
    let d1 = &sample.devices[1];
    assert_eq!(d1.uuid, "GPU-bbbbbbbb-0000-0000-0000-000000000000");
    assert_eq!(d1.minor, Some(1));
    assert_eq!(d1.pci_bus_id.as_deref(), Some("00000000:5E:00.0"));
    assert_eq!(
        d1.memory,
        Some(MemoryInfo { total: 24 * GIB, reserved: 300 << 20, free: 24 * GIB - (300 << 20), used: 300 << 20 })
    );
    assert_eq!(d1.power_mw, Some(16_000));
    assert_eq!(d1.compute_mode, Some(ComputeMode::ExclusiveProcess));
    assert_eq!((d1.energy_mj, d1.temperature_c, d1.mig_enabled), (None, None, None));
    assert_eq!(d1.clocks, Clocks::default());
    assert!(d1.processes.is_empty() && d1.process_utilization.is_empty());
    let whats: Vec<&str> = d1.missing.iter().map(|m| m.what.as_str()).collect();
    assert_eq!(
        whats,
        [
            "energy",
            "clock_graphics",
            "clock_sm",
            "clock_memory",
            "temperature",
            "mig_mode",
            "graphics_processes",
            "mps_processes",
            "process_utilization"
        ]
    );
    assert!(d1.missing.iter().all(|m| m.reason == "NotSupported"), "{:?}", d1.missing);
    assert!(!d1.lost);

    let status = source.status();
    assert!(status.library.ends_with("libnvidia-ml.so.1"), "{}", status.library.display());
    assert_eq!(status.device_count, Some(2));
    assert_eq!(status.samples, 1);
    assert_eq!(status.failed_readings.get("not_supported"), Some(&9));
}

#[test]
fn processes_are_merged_across_lists_by_pid() {
    let gpu = Device::new("GPU-cccccccc-0000-0000-0000-000000000000")
        .compute_processes(vec![Process::new(10, 4 * GIB), Process::unavailable(20)])
        .graphics_processes(vec![Process::new(10, 4 * GIB), Process::new(30, GIB)])
        .mps_processes(vec![Process::new(20, 2 * GIB)]);
    let (_dir, mut source) = open(&Scenario::new("550.54.15").device(gpu));
    let procs = &source.sample().devices[0].processes;
    assert_eq!(
        procs,
        &[
            GpuProcess { pid: 10, used_bytes: Some(4 * GIB), compute: true, graphics: true, ..Default::default() },
            GpuProcess { pid: 20, used_bytes: Some(2 * GIB), compute: true, mps: true, ..Default::default() },
            GpuProcess { pid: 30, used_bytes: Some(GIB), graphics: true, ..Default::default() },
        ]
    );
    // Only "unavailable" everywhere stays unknown, not 0.
    let gpu = Device::new("GPU-dddddddd-0000-0000-0000-000000000000").compute_processes(vec![Process::unavailable(7)]);
    let (_dir, mut source) = open(&Scenario::new("550.54.15").device(gpu));
    assert_eq!(source.sample().devices[0].processes[0].used_bytes, None);
}

#[test]
fn process_utilization_is_never_counted_twice_and_new_samples_arrive_live() {
    let samples = vec![UtilizationSample::new(1, 100, 10, 1, 0, 0), UtilizationSample::new(2, 200, 20, 2, 0, 0)];
    let scenario = Scenario::new("550.54.15").device(Device::new("GPU-e").process_utilization(samples.clone()));
    let dir = tempfile::tempdir().unwrap();
    let lib = fake_nvml::install(dir.path(), &scenario).unwrap();
    let mut source = NvmlSource::open(&required(&lib)).unwrap().into_source().unwrap();

    let first = source.sample();
    let ts: Vec<u64> = first.devices[0].process_utilization.iter().map(|s| s.timestamp_us).collect();
    assert_eq!(ts, [100, 200]);

    // Nothing newer: NVML answers NOT_FOUND, which is "no samples", not a failure.
    let second = source.sample();
    assert!(second.devices[0].process_utilization.is_empty());
    let d = &second.devices[0];
    assert!(!d.missing.iter().any(|m| m.what == "process_utilization"), "{:?}", d.missing);
    assert_eq!(source.status().failed_readings.get("not_found"), None);

    let mut more = samples;
    more.push(UtilizationSample::new(3, 300, 30, 3, 1, 2));
    fake_nvml::write_scenario(
        dir.path(),
        &Scenario::new("550.54.15").device(Device::new("GPU-e").process_utilization(more)),
    )
    .unwrap();
    let third = source.sample();
    assert_eq!(
        third.devices[0].process_utilization,
        [ProcessUtilization { pid: 3, timestamp_us: 300, sm_pct: 30, mem_pct: 3, enc_pct: 1, dec_pct: 2 }]
    );
}

#[test]
fn mig_instances_are_enumerated_with_memory_and_processes() {
    let gpu = Device::new("GPU-ffffffff-0000-0000-0000-000000000000")
        .name("NVIDIA A100-SXM4-40GB")
        .memory(40 * GIB, GIB, 12 * GIB)
        .mig_instance(
            MigInstance::new("MIG-11111111-0000-0000-0000-000000000000", 1, 0)
                .name("NVIDIA A100-SXM4-40GB MIG 3g.20gb")
                .memory(20 * GIB, 0, 8 * GIB)
                .compute_processes(vec![Process::new(501, 6 * GIB)])
                .graphics_processes(vec![]),
        )
        .mig_instance(
            MigInstance::new("MIG-22222222-0000-0000-0000-000000000000", 2, 0)
                .memory(10 * GIB, 0, 2 * GIB)
                .compute_processes(vec![Process::new(502, GIB), Process::new(503, GIB / 2)]),
        );
    let (_dir, mut source) = open(&Scenario::new("550.54.15").device(gpu));
    let d = &source.sample().devices[0];
    assert_eq!(d.mig_enabled, Some(true));
    assert_eq!(d.mig_instances.len(), 2);
    let a = &d.mig_instances[0];
    assert_eq!(
        (a.index, a.uuid.as_str(), a.gpu_instance_id, a.compute_instance_id, a.name.as_deref()),
        (0, "MIG-11111111-0000-0000-0000-000000000000", Some(1), Some(0), Some("NVIDIA A100-SXM4-40GB MIG 3g.20gb"))
    );
    assert_eq!(a.memory, Some(MemoryInfo { total: 20 * GIB, reserved: 0, free: 12 * GIB, used: 8 * GIB }));
    assert_eq!(
        a.processes,
        [GpuProcess {
            pid: 501,
            used_bytes: Some(6 * GIB),
            compute: true,
            gpu_instance_id: Some(1),
            compute_instance_id: Some(0),
            ..Default::default()
        }]
    );
    assert_eq!(a.missing, [missing("mps_processes", "NotSupported")]);
    let b = &d.mig_instances[1];
    assert_eq!((b.index, b.gpu_instance_id, b.name.as_deref()), (1, Some(2), None));
    assert_eq!(
        b.processes.iter().map(|p| (p.pid, p.gpu_instance_id)).collect::<Vec<_>>(),
        [(502, Some(2)), (503, Some(2))]
    );
    assert!(b.missing.contains(&missing("name", "NotSupported")));
}

#[test]
fn a_gpu_lost_mid_run_is_marked_and_the_other_still_reads() {
    let scenario = two_gpus();
    let dir = tempfile::tempdir().unwrap();
    let lib = fake_nvml::install(dir.path(), &scenario).unwrap();
    let mut source = NvmlSource::open(&required(&lib)).unwrap().into_source().unwrap();
    let before = source.sample();
    assert!(before.devices.iter().all(|d| !d.lost));

    let mut fallen = scenario.clone();
    fallen.devices[0] = fallen.devices[0].clone().error("*", abi::GPU_IS_LOST);
    fake_nvml::write_scenario(dir.path(), &fallen).unwrap();
    let after = source.sample();
    let d0 = &after.devices[0];
    assert!(d0.lost);
    assert_eq!(d0.uuid, "GPU-aaaaaaaa-0000-0000-0000-000000000000", "the lost GPU keeps its identity");
    assert_eq!(d0.missing, [missing("device", "GpuLost")]);
    assert_eq!((d0.memory, d0.power_mw), (None, None));
    assert_eq!(after.devices[1], before.devices[1]);
    assert_eq!(source.status().failed_readings.get("gpu_lost"), Some(&1));

    // Lost after the handle was obtained: the first failing reading says so, the rest are skipped.
    let mut late = scenario;
    late.devices[0] = late.devices[0].clone().error("nvmlDeviceGetMemoryInfo_v2", abi::GPU_IS_LOST);
    fake_nvml::write_scenario(dir.path(), &late).unwrap();
    let d0 = source.sample().devices.remove(0);
    assert!(d0.lost);
    assert_eq!(d0.missing, [missing("memory", "GpuLost")]);
    assert_eq!(d0.pci_bus_id.as_deref(), Some("00000000:3B:00.0"));
    assert_eq!((d0.power_mw, d0.processes.len()), (None, 0));
}

#[test]
fn unsupported_energy_is_missing_not_zero_and_energy_grows_when_supported() {
    let gpu = h100("GPU-11111111-0000-0000-0000-000000000000", 0, "00000000:3B:00.0");
    let scenario = Scenario::new("550.54.15")
        .device(gpu.clone().error("nvmlDeviceGetTotalEnergyConsumption", abi::NOT_SUPPORTED))
        .device(gpu.energy_rate_mw(1_000_000));
    let (_dir, mut source) = open(&scenario);
    let first = source.sample();
    assert_eq!(first.devices[0].energy_mj, None);
    assert_eq!(first.devices[0].missing, [missing("energy", "NotSupported")]);
    std::thread::sleep(std::time::Duration::from_millis(20));
    let second = source.sample();
    let (e1, e2) = (first.devices[1].energy_mj.unwrap(), second.devices[1].energy_mj.unwrap());
    assert!(e1 >= 9_000_000 && e2 >= e1 + 10_000, "energy {e1} -> {e2} at 1 kW over >= 20 ms");
}

#[test]
fn modes_with_a_missing_library() {
    let dir = tempfile::tempdir().unwrap();
    let absent = dir.path().join("nowhere").join("libnvidia-ml.so.1");
    let settings = |mode| fake(NvmlSettings { mode, library: Some(absent.clone()) });

    let err = NvmlSource::open(&settings(SourceMode::Required)).unwrap_err();
    assert!(matches!(err, NvmlOpenError::LibraryNotFound { .. }), "{err:?}");
    let text = err.to_string();
    for needle in [absent.to_str().unwrap(), "libnvidia-ml1", "nvml.library", "nvml.mode = \"off\""] {
        assert!(text.contains(needle), "{text:?} lacks {needle:?}");
    }
    assert_eq!(err.reason(), "library_not_found");

    let auto = NvmlSource::open(&settings(SourceMode::Auto)).unwrap();
    assert_eq!(auto.unavailable_reason().map(NvmlOpenError::reason), Some("library_not_found"));
    assert!(matches!(NvmlSource::open(&settings(SourceMode::Off)).unwrap(), NvmlOpen::Off));
}

#[test]
fn driver_not_loaded_from_the_fake_is_reported_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let lib = fake_nvml::install(dir.path(), &two_gpus().init_error(abi::DRIVER_NOT_LOADED)).unwrap();
    let err = NvmlSource::open(&required(&lib)).unwrap_err();
    assert!(matches!(err, NvmlOpenError::DriverNotLoaded { .. }), "{err:?}");
    // Live: once the driver "loads", the same library initialises.
    fake_nvml::write_scenario(dir.path(), &two_gpus()).unwrap();
    let source = NvmlSource::open(&required(&lib)).unwrap().into_source().unwrap();
    assert_eq!(source.status().driver_version.as_deref(), Some("550.54.15"));
}

/// Without the kernel module (`<proc_root>/driver/nvidia` missing) NVML is not initialised at all:
/// NVIDIA's library, run as root, would create `/dev/nvidiactl` (tests/tests/nvml_host.rs shows both
/// sides with the real library in a private /dev). An explicit library does not change that; an
/// explicit library on simulated devices (a test double) does.
#[test]
fn without_the_driver_nvml_is_not_initialised() {
    let proc = tempfile::tempdir().unwrap();
    let fake_dir = tempfile::tempdir().unwrap();
    let fake_lib = fake_nvml::install(fake_dir.path(), &two_gpus()).unwrap();
    let cfg = |mode, library: Option<&Path>, simulated_devices| Config {
        nvml: NvmlSettings { mode, library: library.map(Path::to_path_buf) },
        proc_root: proc.path().to_path_buf(),
        simulated_devices,
        ..Config::default()
    };
    let missing = format!("({}/driver/nvidia missing)", proc.path().display());
    for (library, simulated) in [(None, false), (Some(fake_lib.as_path()), false), (None, true)] {
        let auto = NvmlSource::open(&cfg(SourceMode::Auto, library, simulated)).unwrap();
        let reason = auto.unavailable_reason().expect("unavailable without the driver");
        assert!(matches!(reason, NvmlOpenError::DriverAbsent { .. }), "{library:?} {simulated}: {reason:?}");
        assert_eq!(reason.reason(), "driver_not_loaded");
        let text = reason.to_string();
        for needle in
            ["NVML not initialised", "driver is not loaded", &missing, "would create /dev/nvidiactl", "nvml.mode"]
        {
            assert!(text.contains(needle), "{text:?} lacks {needle:?}");
        }
        let err = NvmlSource::open(&cfg(SourceMode::Required, library, simulated)).unwrap_err();
        assert!(matches!(err, NvmlOpenError::DriverAbsent { .. }), "{err:?}");
        assert!(matches!(NvmlSource::open(&cfg(SourceMode::Off, library, simulated)).unwrap(), NvmlOpen::Off));
    }
    let double = NvmlSource::open(&cfg(SourceMode::Required, Some(&fake_lib), true)).unwrap();
    assert!(double.into_source().is_some(), "the fake on simulated devices is a test double, initialised");
}

/// The real `libnvidia-ml.so.1` (Debian `libnvidia-ml1`, installed by `cargo xtask setup`).
fn real_library() -> PathBuf {
    let candidates = [
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        "/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        "/usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so.1",
        "/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1",
        "/usr/lib64/libnvidia-ml.so.1",
    ];
    if let Some(p) = candidates.iter().map(PathBuf::from).find(|p| p.exists()) {
        return p;
    }
    let ldconfig = std::process::Command::new("ldconfig").arg("-p").output().map(|o| o.stdout).unwrap_or_default();
    String::from_utf8_lossy(&ldconfig)
        .lines()
        .find(|l| l.contains("libnvidia-ml.so.1"))
        .and_then(|l| l.split("=> ").nth(1))
        .map(|p| PathBuf::from(p.trim()))
        .expect("the real libnvidia-ml.so.1 is not installed: run `cargo xtask setup` (apt-get install libnvidia-ml1)")
}

/// On a node with the NVIDIA driver the real library opens; on one without, it is not initialised
/// (which is what keeps `/dev/nvidiactl` from being created when this runs as root).
#[test]
fn the_real_library_is_used_only_with_the_kernel_module() {
    let lib = real_library();
    let settings = |mode| Config { nvml: NvmlSettings { mode, library: Some(lib.clone()) }, ..Config::default() };
    if Path::new("/proc/driver/nvidia/version").exists() {
        let source = NvmlSource::open(&settings(SourceMode::Required))
            .expect("NVML on a node with the driver")
            .into_source()
            .expect("ready");
        assert!(source.status().driver_version.is_some());
        return;
    }
    let auto = NvmlSource::open(&settings(SourceMode::Auto)).unwrap();
    let reason = auto.unavailable_reason().expect("auto mode without the driver is unavailable");
    assert!(matches!(reason, NvmlOpenError::DriverAbsent { .. }), "{reason:?}");
    assert!(reason.to_string().contains("(/proc/driver/nvidia missing)"), "{reason}");

    let err = NvmlSource::open(&settings(SourceMode::Required)).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("NVML not initialised") && text.contains("modprobe nvidia"), "{text}");
}

/// Issue 45 item 6: the test-double switch (`simulated_devices` with an explicit library) takes only
/// the double, recognised by the symbol it exports; NVIDIA's library named there keeps the driver
/// rule (it was initialised, and created /dev/nvidiactl as root).
#[test]
fn only_the_double_passes_for_the_test_double_switch() {
    use tracer_agent::nvml::sampler::is_double;
    let real = real_library();
    let double = fake_nvml::harness::built_library().expect("the fake NVML is built with the tests");
    assert!(is_double(&double), "{} lacks the marker", double.display());
    assert!(!is_double(&real), "{} taken for the double", real.display());
    assert!(!is_double(Path::new("/nonexistent/libnvidia-ml.so.1")));
    assert!(!is_double(&std::env::current_exe().unwrap()), "an ELF file without the marker");
    if Path::new("/proc/driver/nvidia").exists() {
        return;
    }
    let switch = fake(NvmlSettings { mode: SourceMode::Auto, library: Some(real) });
    let open = NvmlSource::open(&switch).unwrap();
    let reason = open.unavailable_reason().expect("NVIDIA's library is not initialised without the driver");
    assert!(matches!(reason, NvmlOpenError::DriverAbsent { .. }), "{reason:?}");
}
