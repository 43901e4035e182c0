use super::*;

#[test]
fn nothing_to_probe_serializes_as_failed() {
    let e = crate::cuda::attach::AttachError::NoLibrary { searched: crate::cuda::attach::SEARCH_PATHS };
    let st = e.family_status();
    assert!(matches!(st, FamilyStatus::NothingToProbe { .. }));
    assert_eq!(st.error(), Some(e.to_string().as_str()));
    assert_eq!(serde_json::to_value(&st).unwrap(), serde_json::json!({ "state": "failed", "error": e.to_string() }));
    let other = crate::cuda::attach::AttachError::NothingAttached { why: "x".into() };
    assert_eq!(other.family_status(), FamilyStatus::Failed { error: other.to_string() });
    assert_eq!(
        serde_json::to_value(FamilyStatus::Attached { programs: vec!["a".into()] }).unwrap(),
        serde_json::json!({ "state": "attached", "programs": ["a"] })
    );
    assert_eq!(serde_json::to_value(FamilyStatus::Disabled).unwrap(), serde_json::json!({ "state": "disabled" }));
    assert_eq!(FamilyStatus::Disabled.error(), None);
}
