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

/// The cookie programs' load failure on a kernel without `bpf_get_attach_cookie` (5.10's verifier,
/// as the guest printed it) chooses the per-entry programs; any other failure does not.
#[test]
fn only_a_missing_cookie_helper_chooses_the_per_entry_programs() {
    let on_5_10 = "loading cuda_count: the BPF_PROG_LOAD syscall returned Invalid argument (os error 22). \
                   Verifier output: arg#0 type is not a struct\n; fun(ctx)\n1: (85) call unknown#174\n\
                   invalid func unknown#174\nverification time 538 usec";
    assert!(no_cookie_helper(on_5_10, false));
    assert!(no_cookie_helper(on_5_10, true), "the verifier's own words win over the feature probe");
    assert!(no_cookie_helper("loading cuda_count: ... invalid func bpf_get_attach_cookie#174", false));
    let other = "loading cuda_count: ... R1 invalid mem access 'scalar'";
    assert!(!no_cookie_helper(other, false));
    assert!(!no_cookie_helper("loading cuda_count: ... invalid func unknown#202", true));
    // The per-entry programs are named by id, the return probes stay shared, and no cookie is sent.
    let per = EntryPrograms::PerEntry { why: "x".into() };
    assert_eq!(per.entry_program(cuda_entry::MEM_FREE, prog_names::CUDA_FREE), "cuda_e15");
    assert_eq!(per.cookie(cuda_entry::MEM_FREE), None);
    assert_eq!(EntryPrograms::Shared.entry_program(cuda_entry::MEM_FREE, prog_names::CUDA_FREE), "cuda_free");
    assert_eq!(EntryPrograms::Shared.cookie(cuda_entry::MEM_FREE), Some(15));
}

/// The reason multi links were not had is one line, never the verifier's log.
#[test]
fn the_multi_link_refusal_is_one_line() {
    let on_5_10 = "loading cuda_count: Invalid argument (os error 22); verifier: 0: (7b) *(u64 *)(r10 -56) = r1 | \
                   1: (85) call unknown#174 | invalid func unknown#174 | processed 2 insns (for uprobe_multi)";
    assert_eq!(
        multi_refused(on_5_10),
        "no multi-uprobe links: loading cuda_count: Invalid argument (os error 22): this kernel lacks \
         bpf_get_attach_cookie (Linux 5.15+)"
    );
    let other = "loading cuda_count: Invalid argument (os error 22); verifier: 0: r1 = 1 | invalid insn";
    assert_eq!(multi_refused(other), "no multi-uprobe links: loading cuda_count: Invalid argument (os error 22)");
    let aya = "loading def_nv_open: the BPF_PROG_LOAD syscall returned Invalid argument (os error 22). Verifier \
               output: 3: (85) call unknown#183\ninvalid func unknown#183\n";
    assert_eq!(
        crate::bpf::load_failure_in_one_line(aya),
        "loading def_nv_open: the BPF_PROG_LOAD syscall returned Invalid argument (os error 22): this kernel \
         lacks bpf_get_func_arg (Linux 5.17+)"
    );
    assert!(crate::bpf::load_failure_in_one_line("x: call unknown#999").ends_with("lacks BPF helper #999"));
}
