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
    assert_eq!(sum, r.total_cents);
    let j: serde_json::Value = serde_json::from_str(&render::json(&r)).unwrap();
    assert_eq!(j["total_nano"], r.total_nano.to_string());
    assert_eq!(j["rows"][0]["group"]["namespace"], "ml");
    assert_eq!(j["rows"].as_array().unwrap().len(), r.rows.len());
}
