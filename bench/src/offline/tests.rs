use super::*;

#[test]
fn corpus_decodes_and_balances_the_ledger() {
    let c = build(2, 50, 8).unwrap();
    assert_eq!(c.allocs, 100);
    let t = measure(&c, 2);
    assert_eq!(t.decode_errors, 0);
    assert_eq!(t.ledger, (200, 200, 0));
    assert!(t.decode_per_s > 0.0 && t.apply_per_s > 0.0);
}
