//! The report as people and programs read it: the table, the CSV and the JSON agree.
use std::collections::BTreeMap;
use tracer_core::cost::{Charge, CostInput, GroupBy, Line, Policy, Report};

use super::render;

fn container(node: &str, ns: &str, pod: &str, team: Option<&str>, nano: i128) -> Charge {
    Charge {
        node: node.into(),
        line: Line::Container,
        namespace: ns.into(),
        pod: pod.into(),
        container: "main".into(),
        labels: team.map(|t| BTreeMap::from([("team".to_owned(), t.to_owned())])).unwrap_or_default(),
        nano,
    }
}

fn input(charges: Vec<Charge>) -> CostInput {
    CostInput { source: "test".into(), period: "test".into(), charges, ..Default::default() }
}

fn sample() -> Vec<Charge> {
    vec![
        container("a", "ml", "train-0", Some("vision"), 3_333_333_333),
        container("a", "ml", "train-1", Some("vision"), 3_333_333_333),
        container("a", "web", "infer-0", Some("search"), 1_111_111_111),
        container("b", "ml", "train-2", None, 2_000_000_005),
        Charge::line("a", Line::Idle, 1_000_000_001),
        Charge::line("a", Line::DriverReserved, 222_222_222),
        Charge::line("b", Line::Idle, 4_999_999_995),
        Charge::line("b", Line::Unattributed, 0),
    ]
}

#[test]
fn renders_table_csv_and_json_that_agree() {
    let r = Report::build(input(sample()), &[GroupBy::Namespace], Policy::Lines);
    let t = render::table(&r, 120);
    assert!(t.contains("(idle)") && t.contains("total"), "{t}");
    assert!(t.contains(&tracer_core::cost::Cents(r.total_cents).to_string()), "{t}");
    let c = render::csv(&r);
    let mut rd = csv::Reader::from_reader(c.as_bytes());
    let rows: Vec<csv::StringRecord> = rd.records().map(Result::unwrap).collect();
    assert_eq!(rows.len(), r.rows.len() + 1);
    let sum: i128 = rows[..r.rows.len()].iter().map(|x| (x[2].parse::<f64>().unwrap() * 100.0).round() as i128).sum();
    assert_eq!(sum, r.total_cents, "amounts of a cent and more: two decimals");
    let j: serde_json::Value = serde_json::from_str(&render::json(&r)).unwrap();
    assert_eq!(j["total_nano"], r.total_nano.to_string());
    assert_eq!(j["rows"][0]["group"]["namespace"], "ml");
    assert_eq!(j["rows"].as_array().unwrap().len(), r.rows.len());
}

/// The printed numbers of a column, in units of its last decimal, and how many decimals it has.
fn units(cells: &[&str]) -> (Vec<i128>, usize) {
    let decimals = cells[0].trim_end_matches('%').split('.').nth(1).map_or(0, str::len);
    let u = cells
        .iter()
        .map(|c| {
            let c = c.trim_end_matches('%');
            assert_eq!(c.split('.').nth(1).map_or(0, str::len), decimals, "one precision for the column: {cells:?}");
            c.replace('.', "").parse::<i128>().unwrap()
        })
        .collect();
    (u, decimals)
}

/// A small bill (issue 42): a 1.1 % share of 0.17 is 0.0019, which two decimals print as 0.00;
/// a 0.04 % share prints as 0.0 %. Every column gets the precision its smallest row needs, and
/// the printed rows still add up to the printed total, in the table, the CSV and the JSON.
#[test]
fn a_small_share_of_a_small_bill_shows_and_the_printed_rows_add_up() {
    let charges = vec![
        container("a", "ml", "train-0", None, 168_062_000),
        container("a", "web", "infer-0", None, 1_870_000),
        container("a", "batch", "tiny-0", None, 68_000),
    ];
    let r = Report::build(input(charges), &[GroupBy::Namespace], Policy::Lines);
    let c = render::csv(&r);
    let rows: Vec<csv::StringRecord> = csv::Reader::from_reader(c.as_bytes()).records().map(Result::unwrap).collect();
    let amounts: Vec<&str> = rows.iter().map(|x| &x[2]).collect();
    let shares: Vec<&str> = rows.iter().map(|x| &x[3]).collect();
    assert_eq!(amounts, ["0.168062", "0.001870", "0.000068", "0.170000"], "{c}");
    assert_eq!(shares, ["98.86%", "1.10%", "0.04%", "100.00%"], "{c}");
    for col in [&amounts, &shares] {
        let (u, _) = units(col);
        assert_eq!(u[..u.len() - 1].iter().sum::<i128>(), u[u.len() - 1], "the rows add up as printed: {col:?}");
    }
    let t = render::table(&r, 120);
    println!("{t}");
    for cell in amounts.iter().chain(&shares) {
        assert!(t.contains(cell), "{cell} in the table: {t}");
    }
    let j: serde_json::Value = serde_json::from_str(&render::json(&r)).unwrap();
    assert_eq!(j["total"], "0.170000");
    assert_eq!(j["rows"][1]["amount"], "0.001870");
}
