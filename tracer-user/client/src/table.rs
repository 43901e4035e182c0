//! The compact table style every people-facing table uses (`top`, the attribution tables, `cost`).
use comfy_table::{ContentArrangement, Table, TableComponent, presets};

/// `table` as text, its cells' control characters escaped (they hold names from Kubernetes,
/// commands and cgroup paths from /proc: text from outside).
pub(crate) fn render(table: &Table) -> String {
    tracer_core::format::printable(&table.to_string()).into_owned()
}

/// A table with `header` in the compact style every people-facing table uses: horizontal rules
/// only, one line per row (a 30-pod node stays readable), columns sized to the content within
/// `width`, one space of padding on the left.
pub(crate) fn compact_table<T: Into<comfy_table::Row>>(width: u16, header: T) -> Table {
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
