use proptest::prelude::*;

use super::*;

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

fn cents_sum(r: &Report) -> i128 {
    r.rows.iter().map(|r| r.cents).sum()
}

#[test]
fn rows_add_up_to_the_bill_to_the_cent() {
    let total: i128 = sample().iter().map(|c| c.nano).sum();
    let r = Report::build(input(sample()), &[], Policy::Lines);
    assert_eq!(r.total_nano, total);
    assert_eq!(r.total_cents, round_cents(total));
    assert_eq!(cents_sum(&r), r.total_cents);
    let names: Vec<_> = r.rows.iter().map(|r| (r.key[0].as_str(), r.nano)).collect();
    assert_eq!(
        names,
        vec![
            ("ml", 8_666_666_671),
            ("web", 1_111_111_111),
            ("(idle)", 5_999_999_996),
            ("(driver reserved)", 222_222_222),
            ("(unattributed)", 0),
        ]
    );
}

#[test]
fn groups_by_label_pod_and_node_and_several_dimensions() {
    let r = Report::build(input(sample()), &[GroupBy::Label("team".into())], Policy::Lines);
    let keys: Vec<_> = r.rows.iter().map(|r| r.key[0].clone()).collect();
    assert_eq!(keys[..3], ["vision", "(no team label)", "search"].map(String::from));
    let r = Report::build(input(sample()), &[GroupBy::Node, GroupBy::Namespace], Policy::Lines);
    assert!(r.rows.iter().any(|r| r.key == ["b", "ml"] && r.nano == 2_000_000_005));
    assert!(r.rows.iter().any(|r| r.key == ["a", "(idle)"] && r.line == Line::Idle));
    let r = Report::build(input(sample()), &[GroupBy::Pod], Policy::Lines);
    assert_eq!(r.rows[0].key, ["ml/train-0"]);
    assert_eq!(cents_sum(&r), r.total_cents);
}

#[test]
fn spread_moves_each_nodes_lines_to_its_containers_only() {
    let r = Report::build(input(sample()), &[GroupBy::Node, GroupBy::Pod], Policy::Spread);
    assert!(r.rows.iter().all(|r| r.line == Line::Container), "{:?}", r.rows);
    // Node b: one container takes all of b's lines.
    let b: i128 = r.rows.iter().filter(|r| r.key[0] == "b").map(|r| r.nano).sum();
    assert_eq!(b, 2_000_000_005 + 4_999_999_995);
    let a: i128 = r.rows.iter().filter(|r| r.key[0] == "a").map(|r| r.nano).sum();
    assert_eq!(a + b, r.total_nano);
    // In proportion: train-0 and train-1 paid the same, infer-0 a third of either.
    let get = |p: &str| r.rows.iter().find(|r| r.key[1] == p).unwrap().nano;
    assert!((get("ml/train-0") - get("ml/train-1")).abs() <= 1);
    assert!((get("ml/train-0") - 3 * get("web/infer-0")).abs() <= 3);
}

#[test]
fn a_node_without_container_cost_keeps_its_lines_under_spread() {
    let charges = vec![Charge::line("a", Line::Idle, 5), container("b", "ml", "x", None, 7)];
    let r = Report::build(input(charges), &[GroupBy::Node], Policy::Spread);
    assert!(r.rows.iter().any(|r| r.line == Line::Idle && r.key == ["a"]));
    assert_eq!(r.total_nano, 12);
}

#[test]
fn group_by_parses_and_explains_itself() {
    assert_eq!("label:team".parse::<GroupBy>().unwrap(), GroupBy::Label("team".into()));
    assert_eq!("node".parse::<GroupBy>().unwrap(), GroupBy::Node);
    let e = "label:".parse::<GroupBy>().unwrap_err().to_string();
    assert!(e.contains("label:KEY"), "{e}");
    assert!("team".parse::<GroupBy>().is_err());
}

#[test]
fn cents_print_with_two_decimals_and_a_sign() {
    assert_eq!(Cents(12345).to_string(), "123.45");
    assert_eq!(Cents(-5).to_string(), "-0.05");
    assert_eq!(Cents(0).to_string(), "0.00");
    assert_eq!(round_cents(5_000_000), 1);
    assert_eq!(round_cents(4_999_999), 0);
    assert_eq!(round_cents(-5_000_000), -1);
}

proptest! {
    #[test]
    fn rounded_rows_always_add_up_to_the_rounded_total(
        nano in prop::collection::vec(-1_000_000_000_000i128..1_000_000_000_000_000, 0..40),
    ) {
        let total = round_cents(nano.iter().sum());
        let cents = split_cents(&nano, total);
        prop_assert_eq!(cents.iter().sum::<i128>(), total);
        for (c, n) in cents.iter().zip(&nano) {
            // Each row is within a cent of its exact amount.
            prop_assert!((c * NANO_PER_CENT - n).abs() < 2 * NANO_PER_CENT, "{} cents for {} nano", c, n);
        }
    }

    #[test]
    fn proportional_splits_are_exact(
        total in -1_000_000_000_000_000i128..1_000_000_000_000_000,
        weights in prop::collection::vec(0i128..1_000_000_000_000_000, 1..30),
    ) {
        match split_proportional(total, &weights) {
            None => prop_assert!(weights.iter().all(|w| *w == 0)),
            Some(parts) => {
                prop_assert_eq!(parts.iter().sum::<i128>(), total);
                for (p, w) in parts.iter().zip(&weights) {
                    if *w == 0 { prop_assert_eq!(*p, 0); }
                }
            }
        }
    }

    #[test]
    fn every_policy_and_grouping_keeps_the_total(
        amounts in prop::collection::vec((0usize..3, 0usize..4, 0u64..10_000_000_000u64), 1..30),
        spread_policy in any::<bool>(),
    ) {
        let charges: Vec<Charge> = amounts
            .iter()
            .map(|&(node, who, nano)| {
                let node = ["a", "b", "c"][node];
                match who {
                    0 => Charge::line(node, Line::Idle, nano as i128),
                    1 => Charge::line(node, Line::Evicted, nano as i128),
                    w => container(node, ["x", "y"][w - 2], "p", None, nano as i128),
                }
            })
            .collect();
        let total: i128 = charges.iter().map(|c| c.nano).sum();
        let policy = if spread_policy { Policy::Spread } else { Policy::Lines };
        for by in [vec![], vec![GroupBy::Node], vec![GroupBy::Pod, GroupBy::Node]] {
            let r = Report::build(input(charges.clone()), &by, policy);
            prop_assert_eq!(r.total_nano, total);
            prop_assert_eq!(r.rows.iter().map(|r| r.nano).sum::<i128>(), total);
            prop_assert_eq!(cents_sum(&r), r.total_cents);
        }
    }
}
