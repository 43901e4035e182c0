//! A [`Report`] as a table for people, CSV for spreadsheets, or JSON for scripts. Amounts are in
//! the price's currency, with two decimals or as many more as a small row needs to show (the same
//! precision for the whole bill); the rows' amounts and shares add up to the total as printed.
use std::fmt::Write as _;

use serde::Serialize;

use crate::table::compact_table;
use tracer_core::attribution::{format_currency_parts, split::split_exact};
use tracer_core::cost::{Cents, GroupBy, Line, Report, Row};
use tracer_core::format::unix_time;

/// The bill's amounts and shares as printed: each column with one precision for the whole table,
/// enough that no row that is not zero prints as zero, and the rows split from the printed total
/// by the largest-remainder rule with their exact amounts as weights, so that the printed rows add
/// up to the printed total (the rule of `top`'s bill line, `attribution::format_currency_parts`).
struct Printed {
    total: String,
    rows: Vec<String>,
    /// `-` for a zero total.
    total_share: String,
    shares: Vec<String>,
}

fn printed(r: &Report) -> Printed {
    let nanos: Option<Vec<u64>> = r.rows.iter().map(|row| u64::try_from(row.nano).ok()).collect();
    let (total, rows) = match (nanos.as_deref(), u64::try_from(r.total_nano)) {
        (Some(parts), Ok(total)) => format_currency_parts(total, parts),
        // A negative amount (never in the agents' bills; a hand-made events file): cents.
        _ => (Cents(r.total_cents).to_string(), r.rows.iter().map(|row| Cents(row.cents).to_string()).collect()),
    };
    let (total_share, shares) = match nanos {
        Some(parts) if r.total_nano > 0 => shares(&parts),
        _ => ("-".to_string(), vec!["-".to_string(); r.rows.len()]),
    };
    Printed { total, rows, total_share, shares }
}

/// Percentages of `parts`' sum that add up to `100.0%` as printed: one decimal, more (up to four)
/// while a part that is not zero would print as zero.
fn shares(parts: &[u64]) -> (String, Vec<String>) {
    let weights: Vec<u128> = parts.iter().map(|p| u128::from(*p)).collect();
    let mut decimals = 1;
    let units = loop {
        let total = 100 * 10u64.pow(decimals);
        let units = split_exact(total, &weights).unwrap_or_else(|| vec![0; parts.len()]);
        let hidden = parts.iter().zip(&units).any(|(p, u)| *p > 0 && *u == 0);
        if !hidden || decimals == 4 {
            break units;
        }
        decimals += 1;
    };
    let fmt = |u: u64| {
        let scale = 10u64.pow(decimals);
        format!("{}.{:0width$}%", u / scale, u % scale, width = decimals as usize)
    };
    (fmt(100 * 10u64.pow(decimals)), units.into_iter().map(fmt).collect())
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
    let p = printed(r);
    for (i, row) in r.rows.iter().enumerate() {
        let mut c = cells(row, &r.by);
        c.push(p.rows[i].clone());
        c.push(p.shares[i].clone());
        t.add_row(c);
    }
    let mut total = vec![String::new(); n];
    total[0] = "total".into();
    total.push(p.total.clone());
    total.push(p.total_share.clone());
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
    let p = printed(r);
    for (i, row) in r.rows.iter().enumerate() {
        let mut c = row.key.clone();
        c.push(row.line_name().to_owned());
        c.push(p.rows[i].clone());
        c.push(p.shares[i].clone());
        let _ = w.write_record(&c);
    }
    let mut total = vec![String::new(); r.by.len()];
    total[0] = "total".into();
    total.extend([String::new(), p.total, p.total_share]);
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
    let p = printed(r);
    let rows = r
        .rows
        .iter()
        .zip(&p.rows)
        .map(|(row, amount)| JsonRow {
            group: r
                .by
                .iter()
                .zip(&row.key)
                .map(|(b, k)| (b.heading().to_owned(), serde_json::Value::String(k.clone())))
                .collect(),
            line: row.line_name(),
            amount: amount.clone(),
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
        total: p.total.clone(),
        total_nano: r.total_nano.to_string(),
        rows,
        warnings: &r.warnings,
    };
    serde_json::to_string_pretty(&j).unwrap_or_default() + "\n"
}
