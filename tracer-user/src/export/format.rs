//! Formatting shared by the people-facing outputs (`top`, the attribution tables): sizes in
//! binary units and the one compact table style.
use comfy_table::{ContentArrangement, Table, TableComponent, presets};

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

/// A table with `header` in the compact style every people-facing table uses: horizontal rules
/// only, one line per row (a 30-pod node stays readable), columns sized to the content within
/// `width`, one space of padding on the left.
pub fn compact_table<T: Into<comfy_table::Row>>(width: u16, header: T) -> Table {
    let mut table = Table::new();
    table.load_preset(presets::UTF8_HORIZONTAL_ONLY).set_content_arrangement(ContentArrangement::Dynamic);
    table.remove_style(TableComponent::HorizontalLines);
    table.remove_style(TableComponent::MiddleIntersections);
    table.remove_style(TableComponent::LeftBorderIntersections);
    table.remove_style(TableComponent::RightBorderIntersections);
    table.set_width(width);
    table.set_header(header);
    for col in table.column_iter_mut() {
        col.set_padding((1, 0));
    }
    table
}
