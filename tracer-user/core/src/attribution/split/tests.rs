use super::*;
use proptest::prelude::*;

#[test]
fn thirds_of_ten() {
    assert_eq!(split_exact(10, &[1, 1, 1]), Some(vec![4, 3, 3]));
    assert_eq!(split_exact(0, &[1, 2]), Some(vec![0, 0]));
    assert_eq!(split_exact(5, &[0, 0]), None);
    assert_eq!(split_or(5, &[0, 0], 1), vec![0, 5]);
    assert_eq!(split_exact(100, &[3, 1]), Some(vec![75, 25]));
}

#[test]
fn huge_weights_do_not_overflow() {
    let w = [u128::MAX / 3, u128::MAX / 3, 1];
    let p = split_exact(u64::MAX, &w).unwrap();
    assert_eq!(p.iter().map(|&x| x as u128).sum::<u128>(), u64::MAX as u128);
}

proptest! {
    #[test]
    fn parts_sum_exactly(total in any::<u64>(), weights in prop::collection::vec(any::<u64>(), 0..40)) {
        let w: Vec<u128> = weights.iter().map(|&x| x as u128).collect();
        match split_exact(total, &w) {
            Some(p) => {
                prop_assert_eq!(p.len(), w.len());
                prop_assert_eq!(p.iter().map(|&x| x as u128).sum::<u128>(), total as u128);
                // A zero weight gets nothing.
                for (x, w) in p.iter().zip(&w) {
                    if *w == 0 { prop_assert_eq!(*x, 0); }
                }
            }
            None => prop_assert!(w.iter().all(|&x| x == 0)),
        }
    }
}
