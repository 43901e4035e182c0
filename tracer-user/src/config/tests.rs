use super::*;

#[test]
fn defaults_round_trip_and_unknown_keys_warn() {
    let (c, w) = Config::from_toml("dev_dir = \"/tmp/x\"\nbogus = 1\n[families]\ndriver = false\n").unwrap();
    assert_eq!(c.dev_dir, PathBuf::from("/tmp/x"));
    assert!(!c.families.driver);
    assert!(c.families.lifecycle);
    assert_eq!(w, vec!["unknown config key `bogus` ignored".to_string()]);
    assert_eq!(c.dev_prefix(), "/tmp/x/nvidia");
}

#[test]
fn validate_rejects_bad_ring_size_and_long_dir() {
    let c = Config { ring_buffer_bytes: 5000, ..Default::default() };
    assert!(c.validate().unwrap_err().to_string().contains("ring_buffer_bytes"));
    let c = Config { dev_dir: PathBuf::from(format!("/{}", "a".repeat(80))), ..Default::default() };
    assert!(c.validate().unwrap_err().to_string().contains("too long"));
    Config::default().validate().unwrap();
}

const FILE: &str = "dev_dir = \"/file/dev\"\nproc_root = \"/file/proc\"\nattach_mode = \"raw-tracepoint\"\n\
                    driver_version = \"535.1.2\"\ncuda_libraries = [\"/file/libcuda.so.1\"]\n\
                    [families]\nlifecycle = false\n[nvml]\nmode = \"off\"\nlibrary = \"/file/nvml.so\"\n\
                    [attribution]\nprice_per_gpu_hour = 2.0\ncost_policy = \"blended\"\n";

#[test]
fn no_overrides_change_nothing() {
    let (file, _) = Config::from_toml(FILE).unwrap();
    let mut c = file.clone();
    Overrides::default().apply(&mut c);
    assert_eq!(c, file);
    let mut d = Config::default();
    Overrides::default().apply(&mut d);
    assert_eq!(d, Config::default());
}

#[test]
fn flags_beat_the_file_which_beats_the_defaults() {
    let (mut c, w) = Config::from_toml(FILE).unwrap();
    assert!(w.is_empty(), "{w:?}");
    let o = Overrides {
        dev_dir: Some("/flag/dev".into()),
        attach_mode: Some(AttachMode::SyscallTracepoint),
        no_cuda: true,
        libcuda: vec!["/flag/a.so".into(), "/flag/b.so".into()],
        nvml: Some(SourceMode::Required),
        price_per_gpu_hour: Some(3.5),
        price_per_node_hour: Some(20.0),
        unused_cost: Some(UnusedCost::Spread),
        ..Default::default()
    };
    o.apply(&mut c);
    // Flags given: theirs.
    assert_eq!(c.dev_dir, PathBuf::from("/flag/dev"));
    assert_eq!(c.attach_mode, AttachMode::SyscallTracepoint);
    assert!(!c.families.cuda);
    assert_eq!(c.cuda_libraries, vec![PathBuf::from("/flag/a.so"), PathBuf::from("/flag/b.so")]);
    assert_eq!(c.nvml.mode, SourceMode::Required);
    assert_eq!(c.attribution.price_per_gpu_hour, Some(3.5));
    assert_eq!(c.attribution.price_per_node_hour, Some(20.0));
    assert_eq!(c.attribution.unused_cost, UnusedCost::Spread);
    // Flags absent: the file's.
    assert_eq!(c.proc_root, PathBuf::from("/file/proc"));
    assert_eq!(c.driver_version.as_deref(), Some("535.1.2"));
    assert!(!c.families.lifecycle, "an absent --no-lifecycle does not turn the family back on");
    assert_eq!(c.nvml.library, Some(PathBuf::from("/file/nvml.so")));
    assert_eq!(c.attribution.cost_policy, CostPolicy::Blended);
    // Neither: the defaults.
    assert!(c.families.driver);
    assert_eq!(c.snapshot_interval_ms, Config::default().snapshot_interval_ms);
    assert_eq!(c.kubernetes, KubeSettings::default());
}

#[test]
fn the_remaining_flags_override_too() {
    let mut c = Config::default();
    let o = Overrides {
        proc_root: Some("/flag/proc".into()),
        driver_version: Some("550.54".into()),
        no_driver: true,
        no_lifecycle: true,
        nvml_library: Some("/flag/nvml.so".into()),
        cost_policy: Some(CostPolicy::RequestBased),
        ..Default::default()
    };
    o.apply(&mut c);
    assert_eq!(c.proc_root, PathBuf::from("/flag/proc"));
    assert_eq!(c.driver_version.as_deref(), Some("550.54"));
    assert_eq!(c.families, Families { driver: false, lifecycle: false, cuda: true });
    assert_eq!(c.nvml.library, Some(PathBuf::from("/flag/nvml.so")));
    assert_eq!(c.attribution.cost_policy, CostPolicy::RequestBased);
    assert_eq!(c.dev_dir, PathBuf::from("/dev"));
    assert!(c.cuda_libraries.is_empty(), "no --libcuda keeps the (empty) default search");
}

#[test]
fn nvml_only_turns_every_family_off() {
    let (mut c, _) = Config::from_toml("[families]\ndriver = true\nlifecycle = true\ncuda = true\n").unwrap();
    Overrides { nvml_only: true, ..Default::default() }.apply(&mut c);
    assert_eq!(c.families, Families { driver: false, lifecycle: false, cuda: false });
    assert!(!c.families.any());
    // Whatever the other family flags say.
    let mut c = Config::default();
    Overrides { nvml_only: true, no_cuda: true, ..Default::default() }.apply(&mut c);
    assert!(!c.families.any());
}

mod version_tests {
    use super::super::*;

    #[test]
    fn parses_proc_driver_version_line() {
        let v = parse_driver_version(
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.261.03  Wed Jul 30 2025\nGCC version:  gcc version 12.2.0",
        )
        .unwrap();
        assert_eq!(v, tracer_common::nv::DriverVersion::new(535, 261, 3));
        assert_eq!(parse_driver_version("550.54").unwrap(), tracer_common::nv::DriverVersion::new(550, 54, 0));
        assert!(parse_driver_version("gcc 12.2.0").is_none());
    }
}
