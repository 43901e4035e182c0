//! Sizes and times as people read them, shared by every output that prints them (`top`, the
//! attribution tables, `cost`, the ledger's completeness notes): sizes in binary units, UTC times.

/// `1.5 GiB`-style sizes (binary units), `0` for zero.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if b == 0 {
        return "0".into();
    }
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else if v >= 100.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// A total of bytes and its parts printed together (a table column with a total row): one unit
/// and one precision for all of them (the total's unit, as [`human_bytes`] picks it, with one
/// decimal), and the parts split from the printed total with the largest-remainder rule by their
/// exact sizes, so the printed parts add up to the printed total (`total` is Σ parts wherever it
/// is used). `None` parts stay `None`; a part of zero bytes is `0`.
pub fn human_bytes_parts(total: u64, parts: &[Option<u64>]) -> (String, Vec<Option<String>>) {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut u = 0;
    while u < UNITS.len() - 1 && total >= 1024u64.pow(u as u32 + 1) {
        u += 1;
    }
    let unit_bytes = 1024u128.pow(u as u32);
    // One decimal (none for bytes), also from 100 of the unit up, so that a small part of a big
    // GPU shows as `0.1 GiB`, not `0 GiB`.
    let decimals = if u > 0 { 1 } else { 0 };
    let scale = 10u128.pow(decimals);
    let shown_total = ((total as u128 * scale + unit_bytes / 2) / unit_bytes) as u64;
    let weights: Vec<u128> = parts.iter().map(|p| p.unwrap_or(0) as u128).collect();
    let split = crate::attribution::split::split_exact(shown_total, &weights).unwrap_or_else(|| vec![0; parts.len()]);
    let fmt = |units: u64| match decimals {
        0 => format!("{units} {}", UNITS[u]),
        _ => format!("{}.{} {}", units / 10, units % 10, UNITS[u]),
    };
    let shown = parts
        .iter()
        .zip(split)
        .map(|(p, units)| p.map(|b| if b == 0 { "0".to_string() } else { fmt(units) }))
        .collect();
    (if total == 0 { "0".to_string() } else { fmt(shown_total) }, shown)
}

/// A Unix time in nanoseconds as UTC, `2026-12-02T02:10:05Z`.
pub fn unix_time(ns: u64) -> String {
    let secs = (ns / 1_000_000_000) as libc::time_t;
    // SAFETY: gmtime_r writes only into `tm`, which lives on this stack frame.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for the call.
    if unsafe { libc::gmtime_r(&secs, &mut tm) }.is_null() {
        return format!("@{secs}");
    }
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

/// `text` safe to print on a terminal: control characters other than newline and tab (ESC, BEL,
/// carriage return, ... — what makes a terminal escape sequence or rewrites a line) and Unicode's
/// bidirectional overrides (which reorder what is shown) are written as `\x1b`, `\u{202e}`.
/// Everything that comes from outside and is printed for people goes through this: error bodies
/// from Prometheus or the API server, names from Kubernetes, commands and cgroup paths from
/// `/proc`, kernel names from workloads.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| {
        (c.is_control() && c != '\n' && c != '\t')
            || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}')
    };
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if unsafe_char(c) {
            if (c as u32) < 0x80 {
                out.push_str(&format!("\\x{:02x}", c as u32));
            } else {
                out.push_str(&format!("\\u{{{:x}}}", c as u32));
            }
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn escape_sequences_and_bidi_overrides_are_shown_not_obeyed() {
        assert_eq!(printable("plain\tline\nnext é ✓"), "plain\tline\nnext é ✓");
        assert!(matches!(printable("plain"), std::borrow::Cow::Borrowed(_)));
        assert_eq!(
            printable("\x1b]0;pwned\x07red \x1b[31mX\x1b[0m\r"),
            "\\x1b]0;pwned\\x07red \\x1b[31mX\\x1b[0m\\x0d"
        );
        assert_eq!(printable("a\u{202e}cod.exe"), "a\\u{202e}cod.exe");
        assert_eq!(printable("\u{9b}31m"), "\\u{9b}31m", "the 8-bit CSI too");
    }
}
