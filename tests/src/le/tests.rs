use super::*;

#[test]
fn round_trip_and_short_buffers() {
    let mut b = [0u8; 16];
    put_u32(&mut b, 4, 0xdead_beef);
    put_u64(&mut b, 8, 0x0123_4567_89ab_cdef);
    assert_eq!(u32_at(&b, 4), 0xdead_beef);
    assert_eq!(u64_at(&b, 8), 0x0123_4567_89ab_cdef);
    put_u32(&mut b, 14, 1); // out of range: dropped
    assert_eq!(u32_at(&b, 14), 0);
    assert_eq!(u64_at(&b, usize::MAX - 2), 0);
    put_cstr(&mut b, 0, 4, "535.261.03");
    assert_eq!(cstr_at(&b, 0, 4), "535");
    assert_eq!(b[3], 0);
}
