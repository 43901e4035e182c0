use super::*;

#[test]
fn every_command_is_documented() {
    let help = cuda_help!();
    for name in COMMANDS {
        assert!(help.lines().any(|l| l.split_whitespace().next() == Some(name)), "{name} documented");
    }
    let documented = help.lines().filter(|l| l.starts_with("cuda-")).count();
    assert_eq!(documented, COMMANDS.len(), "every documented command is in COMMANDS");
}

#[test]
fn error_answers_name_the_call_and_code() {
    assert_eq!(check("cuInit", 100).unwrap_err(), "op=cuInit code=100 name=CUDA_ERROR_NO_DEVICE");
    assert!(check("cuInit", 0).is_ok());
    assert_eq!(error_name(12345), "unknown");
}
