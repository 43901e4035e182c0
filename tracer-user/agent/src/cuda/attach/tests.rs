use super::*;

#[test]
fn attach_error_messages_and_reasons() {
    let e = AttachError::NoLibrary { searched: SEARCH_PATHS };
    assert_eq!(
        e.to_string(),
        format!("no libcuda.so.1 found (searched {}); set `cuda_libraries` in the config", SEARCH_PATHS.join(", "))
    );
    assert_eq!(e.reason(), "no_library");
    assert!(e.is_nothing_to_probe());
    let io = || std::io::Error::from(std::io::ErrorKind::NotFound);
    let e = AttachError::Stat { path: "/x/libcuda.so.1".into(), error: io() };
    assert_eq!(e.to_string(), format!("/x/libcuda.so.1: {}", io()));
    assert!(!e.is_nothing_to_probe());
    let e = AttachError::Read { path: "/x/libcuda.so.1".into(), error: io() };
    assert_eq!(e.to_string(), format!("reading /x/libcuda.so.1: {}", io()));
    let e = AttachError::NoEntryPoint { path: "/x/libcuda.so.1".into(), why: "a: b; c: d".into() };
    assert_eq!(e.to_string(), "no entry point of /x/libcuda.so.1 could be attached: a: b; c: d");
    assert_eq!(e.reason(), "no_entry_point");
    let e = AttachError::NothingAttached { why: "a: b".into() };
    assert_eq!(e.to_string(), "no libcuda entry point could be attached: a: b");
    assert_eq!(e.reason(), "nothing_attached");
}
