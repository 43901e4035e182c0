//! A [`Report`] as a table for people, CSV for spreadsheets, or JSON for scripts. Amounts are in
//! the price's currency with two decimals; the rows' amounts add up to the total as printed.
use std::fmt::Write as _;

use serde::Serialize;

use crate::table::compact_table;
use tracer_core::cost::{Cents, GroupBy, Line, Report, Row};
use tracer_core::format::unix_time;

/// The share of the total, `12.3%` (`-` for a zero total).
fn share(r: &Row, total: i128) -> String {
    if total == 0 { "-".into() } else { format!("{:.1}%", r.nano as f64 * 100.0 / total as f64) }
}

/// The row's cells: one per dimension; a line's row also says which line where no column does.
fn cells(r: &Row, by: &[GroupBy]) -> Vec<String> {
    let mut c = r.key.clone();
    if r.line != Line::Container
        && by.iter().all(|b| *b == GroupBy::Node)
        && let Some(last) = c.last_mut()
    {
        last.push(' ');
        last.push_str(r.line.row_name());
    }
    c
}

fn when(unix_s: Option<f64>) -> Option<String> {
    unix_s.map(|s| unix_time((s.max(0.0) * 1e9) as u64))
}

fn prices(r: &Report) -> String {
    match r.prices_per_gpu_hour.as_slice() {
        [] => "unknown".into(),
        ps => ps.iter().map(|p| format!("{p}")).collect::<Vec<_>>().join(", "),
    }
}

/// The report as a table, with what it covers above and the warnings below.
pub fn table(r: &Report, width: u16) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "Bill {}, from {}", r.period, r.source);
    let _ = writeln!(
        out,
        "price per GPU-hour: {} · policy: {} · amounts in the price's currency",
        prices(r),
        match r.policy {
            tracer_core::cost::Policy::Lines =>
                "lines (idle, driver reserved, unattributed and evicted are rows of their own)",
            tracer_core::cost::Policy::Spread => "spread (each node's other lines spread over its containers by cost)",
        }
    );
    let mut header: Vec<String> = r.by.iter().map(|b| b.heading().to_owned()).collect();
    header.extend(["cost".to_owned(), "share".to_owned()]);
    let mut t = compact_table(width, header);
    let n = r.by.len();
    for row in &r.rows {
        let mut c = cells(row, &r.by);
        c.push(Cents(row.cents).to_string());
        c.push(share(row, r.total_nano));
        t.add_row(c);
    }
    let mut total = vec![String::new(); n];
    total[0] = "total".into();
    total.push(Cents(r.total_cents).to_string());
    total.push(if r.total_nano == 0 { "-".into() } else { "100.0%".into() });
    t.add_row(total);
    for i in [n, n + 1] {
        if let Some(col) = t.column_mut(i) {
            col.set_cell_alignment(comfy_table::CellAlignment::Right);
        }
    }
    let _ = writeln!(out, "{}", crate::table::render(&t));
    for w in &r.warnings {
        let _ = writeln!(out, "warning: {w}");
    }
    out
}

/// CSV (RFC 4180): a header row, one row per group, then the total row.
pub fn csv(r: &Report) -> String {
    let mut w = csv::WriterBuilder::new().from_writer(Vec::new());
    let mut header: Vec<String> = r.by.iter().map(|b| b.heading().to_owned()).collect();
    header.extend(["line", "cost", "share"].map(str::to_owned));
    let _ = w.write_record(&header);
    for row in &r.rows {
        let mut c = row.key.clone();
        c.push(row.line_name().to_owned());
        c.push(Cents(row.cents).to_string());
        c.push(share(row, r.total_nano));
        let _ = w.write_record(&c);
    }
    let mut total = vec![String::new(); r.by.len()];
    total[0] = "total".into();
    total.extend([String::new(), Cents(r.total_cents).to_string(), "100.0%".into()]);
    let _ = w.write_record(&total);
    String::from_utf8(w.into_inner().unwrap_or_default()).unwrap_or_default()
}

#[derive(Serialize)]
struct JsonRow {
    /// Dimension → value.
    group: serde_json::Map<String, serde_json::Value>,
    line: &'static str,
    amount: String,
    nano: String,
    share: f64,
}

#[derive(Serialize)]
struct JsonReport<'a> {
    source: &'a str,
    period: &'a str,
    start: Option<String>,
    end: Option<String>,
    prices_per_gpu_hour: &'a [f64],
    policy: tracer_core::cost::Policy,
    by: Vec<&'a str>,
    total: String,
    /// Exact, as a string (beyond what a JSON number holds exactly).
    total_nano: String,
    rows: Vec<JsonRow>,
    warnings: &'a [String],
}

/// JSON: the rows with their groups, amounts as decimal strings (`"12.34"`) and exact
/// nano-currency (`"12340000000"`), the period, the prices and the policy.
pub fn json(r: &Report) -> String {
    let rows = r
        .rows
        .iter()
        .map(|row| JsonRow {
            group: r
                .by
                .iter()
                .zip(&row.key)
                .map(|(b, k)| (b.heading().to_owned(), serde_json::Value::String(k.clone())))
                .collect(),
            line: row.line_name(),
            amount: Cents(row.cents).to_string(),
            nano: row.nano.to_string(),
            share: if r.total_nano == 0 { 0.0 } else { row.nano as f64 / r.total_nano as f64 },
        })
        .collect();
    let j = JsonReport {
        source: &r.source,
        period: &r.period,
        start: when(r.start_unix_s),
        end: when(r.end_unix_s),
        prices_per_gpu_hour: &r.prices_per_gpu_hour,
        policy: r.policy,
        by: r.by.iter().map(GroupBy::heading).collect(),
        total: Cents(r.total_cents).to_string(),
        total_nano: r.total_nano.to_string(),
        rows,
        warnings: &r.warnings,
    };
    serde_json::to_string_pretty(&j).unwrap_or_default() + "\n"
}
