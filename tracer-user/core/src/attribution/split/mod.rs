//! Splitting an integer total into integer parts that sum to it exactly (largest remainder).
//!
//! Every line the attribution engine publishes is an integer (bytes, millipercent, millijoules,
//! nano-currency), so "the parts add up to the device and the bill" is an equality, not a tolerance.

/// Split `total` in proportion to `weights`; the parts sum to `total` exactly.
///
/// Each part gets `floor(total × w / Σw)`; the units left over go, one each, to the largest
/// fractional remainders (ties: the lower index), so the result is deterministic. Returns `None`
/// when every weight is zero (the caller decides where such a total goes).
pub fn split_exact(total: u64, weights: &[u128]) -> Option<Vec<u64>> {
    // Σw cannot overflow u128 for fewer than 2^64 u64-sized weights; larger weights (products) are
    // reduced first so `total × w` fits.
    let (weights, sum) = reduce(weights)?;
    let total128 = total as u128;
    let mut parts = Vec::with_capacity(weights.len());
    let mut rems = Vec::with_capacity(weights.len());
    let mut given: u128 = 0;
    for (i, w) in weights.iter().enumerate() {
        let prod = total128 * w;
        let q = prod / sum;
        given += q;
        parts.push(q as u64);
        rems.push((prod % sum, i));
    }
    let mut left = (total128 - given) as usize;
    if left > 0 {
        // Largest remainder first; on ties the lower index (stable and deterministic).
        rems.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        for &(_, i) in rems.iter() {
            if left == 0 {
                break;
            }
            parts[i] += 1;
            left -= 1;
        }
    }
    Some(parts)
}

/// Weights scaled down (by a power of two) until `u64::MAX × w` and `Σw` fit in u128.
fn reduce(weights: &[u128]) -> Option<(Vec<u128>, u128)> {
    let max = weights.iter().copied().max().unwrap_or(0);
    if max == 0 {
        return None;
    }
    // Keep each weight below 2^63 and the count bounded, so Σw < 2^127 and total × w < 2^127.
    let shift = (128 - max.leading_zeros()).saturating_sub(63);
    let w: Vec<u128> = weights.iter().map(|w| w >> shift).collect();
    let sum: u128 = w.iter().sum();
    if sum == 0 {
        return None;
    }
    Some((w, sum))
}

/// Split `total` by `weights`, or put all of it on `fallback` when every weight is zero.
pub(crate) fn split_or(total: u64, weights: &[u128], fallback: usize) -> Vec<u64> {
    split_exact(total, weights).unwrap_or_else(|| {
        let mut v = vec![0; weights.len()];
        if let Some(x) = v.get_mut(fallback) {
            *x = total;
        }
        v
    })
}

#[cfg(test)]
mod tests;
