//! Little-endian field access on parameter-struct byte buffers.
//!
//! The doubles build and parse NVIDIA parameter structs as byte buffers at the offsets in
//! `tracer_common::nv::off`, the same way the tracer's decoder does, rather than through
//! `#[repr(C)]` mirrors: a wrong offset then shows up as a wrong value in a test, not as a silently
//! agreeing pair of struct definitions. Out-of-range accesses read as zero / are dropped, so a
//! short buffer from a misbehaving caller can never panic the fake driver.

/// Read a `u32` at `off`, or 0 if the buffer is too short.
pub fn u32_at(buf: &[u8], off: usize) -> u32 {
    off.checked_add(4).and_then(|e| buf.get(off..e)).map_or(0, |b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
}

/// Read a `u64` at `off`, or 0 if the buffer is too short.
pub fn u64_at(buf: &[u8], off: usize) -> u64 {
    off.checked_add(8).and_then(|e| buf.get(off..e)).map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
}

/// Read an `i32` at `off`, or 0 if the buffer is too short.
pub fn i32_at(buf: &[u8], off: usize) -> i32 {
    u32_at(buf, off) as i32
}

/// Write a `u32` at `off`; ignored if the buffer is too short.
pub fn put_u32(buf: &mut [u8], off: usize, v: u32) {
    if let Some(b) = off.checked_add(4).and_then(|e| buf.get_mut(off..e)) {
        b.copy_from_slice(&v.to_le_bytes());
    }
}

/// Write a `u64` at `off`; ignored if the buffer is too short.
pub fn put_u64(buf: &mut [u8], off: usize, v: u64) {
    if let Some(b) = off.checked_add(8).and_then(|e| buf.get_mut(off..e)) {
        b.copy_from_slice(&v.to_le_bytes());
    }
}

/// Write an `i32` at `off`; ignored if the buffer is too short.
pub fn put_i32(buf: &mut [u8], off: usize, v: i32) {
    put_u32(buf, off, v as u32)
}

/// Write a NUL-terminated string into the fixed-size field `buf[off..off + len]`, truncating it to
/// leave room for the terminator and zero-filling the rest.
pub fn put_cstr(buf: &mut [u8], off: usize, len: usize, s: &str) {
    if let Some(field) = off.checked_add(len).and_then(|e| buf.get_mut(off..e)) {
        field.fill(0);
        let n = s.len().min(len.saturating_sub(1));
        field[..n].copy_from_slice(&s.as_bytes()[..n]);
    }
}

/// Read the NUL-terminated string in the fixed-size field `buf[off..off + len]` (lossy UTF-8).
pub fn cstr_at(buf: &[u8], off: usize, len: usize) -> String {
    let field = buf.get(off..off.saturating_add(len).min(buf.len())).unwrap_or(&[]);
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

#[cfg(test)]
mod tests;
