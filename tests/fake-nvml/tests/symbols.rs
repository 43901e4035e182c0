//! The fake covers every symbol nvml-wrapper-sys resolves, and its structs match the bindings.
use std::collections::BTreeSet;
use std::mem::{offset_of, size_of};
use std::path::PathBuf;

use fake_nvml::{IMPLEMENTED, abi};
use nvml_wrapper_sys::bindings as sys;

/// `get(b"nvml…\0")` names in nvml-wrapper-sys's bindings.rs, found through `cargo metadata`.
fn binding_symbols() -> BTreeSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let out = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--offline", "--filter-platform", env!("FAKE_NVML_TARGET")])
        .args(["--manifest-path", manifest])
        .output()
        .expect("run cargo metadata");
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("cargo metadata JSON");
    let pkg = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "nvml-wrapper-sys")
        .expect("nvml-wrapper-sys in the dependency graph");
    let dir = PathBuf::from(pkg["manifest_path"].as_str().unwrap()).parent().unwrap().to_path_buf();
    let text = std::fs::read_to_string(dir.join("src/bindings.rs")).expect("read bindings.rs");
    text.split("get(b\"")
        .skip(1)
        .filter_map(|rest| rest.split_once("\\0\"").map(|(name, _)| name.to_string()))
        .filter(|name| name.starts_with("nvml"))
        .collect()
}

fn stub_list() -> BTreeSet<String> {
    include_str!("../not-supported-symbols.txt")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect()
}

#[test]
fn stub_list_is_the_bindings_minus_what_is_implemented() {
    let bindings = binding_symbols();
    assert!(bindings.len() > 350, "only {} symbols parsed from bindings.rs", bindings.len());
    let implemented: BTreeSet<String> = IMPLEMENTED.iter().map(|s| s.to_string()).collect();
    let stubs = stub_list();
    let want: BTreeSet<String> = bindings.difference(&implemented).cloned().collect();
    let add: Vec<_> = want.difference(&stubs).collect();
    let remove: Vec<_> = stubs.difference(&want).collect();
    assert!(
        add.is_empty() && remove.is_empty(),
        "tests/fake-nvml/not-supported-symbols.txt is out of date with nvml-wrapper-sys: add {add:?}, remove {remove:?}"
    );
    let not_bound: Vec<_> = implemented.difference(&bindings).collect();
    assert!(not_bound.is_empty(), "implemented but not in the bindings: {not_bound:?}");
}

#[test]
fn the_built_library_exports_every_symbol_and_the_soname() {
    let built = fake_nvml::harness::built_library().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let lib_path = dir.path().join("libnvidia-ml.so.1");
    std::fs::copy(&built, &lib_path).unwrap();
    let lib = unsafe { libloading::Library::new(&lib_path) }.unwrap();
    for name in binding_symbols() {
        let sym = unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) };
        assert!(sym.is_ok(), "{name} is not exported");
    }
    // A stub answers NOT_SUPPORTED.
    let stub = unsafe { lib.get::<unsafe extern "C" fn() -> u32>(b"nvmlDeviceGetFanSpeed") }.unwrap();
    assert_eq!(unsafe { stub() }, abi::NOT_SUPPORTED);
    let readelf = std::process::Command::new("readelf").arg("-d").arg(&built).output().expect("readelf (binutils)");
    assert!(String::from_utf8_lossy(&readelf.stdout).contains("Library soname: [libnvidia-ml.so.1]"));
}

#[test]
fn struct_layouts_match_the_bindings() {
    assert_eq!(size_of::<abi::Memory>(), size_of::<sys::nvmlMemory_t>());
    assert_eq!(offset_of!(abi::Memory, free), offset_of!(sys::nvmlMemory_t, free));
    assert_eq!(offset_of!(abi::Memory, used), offset_of!(sys::nvmlMemory_t, used));
    assert_eq!(size_of::<abi::MemoryV2>(), size_of::<sys::nvmlMemory_v2_t>());
    assert_eq!(offset_of!(abi::MemoryV2, total), offset_of!(sys::nvmlMemory_v2_t, total));
    assert_eq!(offset_of!(abi::MemoryV2, reserved), offset_of!(sys::nvmlMemory_v2_t, reserved));
    assert_eq!(offset_of!(abi::MemoryV2, free), offset_of!(sys::nvmlMemory_v2_t, free));
    assert_eq!(offset_of!(abi::MemoryV2, used), offset_of!(sys::nvmlMemory_v2_t, used));
    assert_eq!(size_of::<abi::Utilization>(), size_of::<sys::nvmlUtilization_t>());
    assert_eq!(size_of::<abi::ProcessInfo>(), size_of::<sys::nvmlProcessInfo_t>());
    assert_eq!(offset_of!(abi::ProcessInfo, used_gpu_memory), offset_of!(sys::nvmlProcessInfo_t, usedGpuMemory));
    assert_eq!(offset_of!(abi::ProcessInfo, gpu_instance_id), offset_of!(sys::nvmlProcessInfo_t, gpuInstanceId));
    assert_eq!(
        offset_of!(abi::ProcessInfo, compute_instance_id),
        offset_of!(sys::nvmlProcessInfo_t, computeInstanceId)
    );
    let s = size_of::<sys::nvmlProcessUtilizationSample_t>();
    assert_eq!(size_of::<abi::ProcessUtilizationSample>(), s);
    assert_eq!(
        offset_of!(abi::ProcessUtilizationSample, time_stamp),
        offset_of!(sys::nvmlProcessUtilizationSample_t, timeStamp)
    );
    assert_eq!(
        offset_of!(abi::ProcessUtilizationSample, dec_util),
        offset_of!(sys::nvmlProcessUtilizationSample_t, decUtil)
    );
    assert_eq!(size_of::<abi::PciInfo>(), size_of::<sys::nvmlPciInfo_t>());
    assert_eq!(offset_of!(abi::PciInfo, domain), offset_of!(sys::nvmlPciInfo_t, domain));
    assert_eq!(offset_of!(abi::PciInfo, bus_id), offset_of!(sys::nvmlPciInfo_t, busId));
    assert_eq!(abi::MEMORY_V2_VERSION, (size_of::<sys::nvmlMemory_v2_t>() as u32) | 2 << 24);
}
