//! The XID table held against the extract of NVIDIA's Xid Catalog in `xid-catalog.csv`: every
//! code there maps to the class its resolution bucket names, the table has nothing the extract
//! lacks, and the classes that matter most do what the issue asks of them.

use allot_health::xid::{self, XID_CLASSES};
use allot_health::{Action, Audience, Change, Engine, Reading, Request, RuleSet, Signal};

/// `(xid, catalog_resolution, description)` rows of the extract.
fn catalog() -> Vec<(u64, String, String)> {
    let text = include_str!("xid-catalog.csv");
    let mut lines = text.lines().filter(|l| !l.starts_with('#'));
    assert_eq!(lines.next(), Some("xid,catalog_resolution,description"));
    lines
        .map(|line| {
            let mut cols = line.splitn(3, ',');
            let mut col = || cols.next().unwrap_or_else(|| panic!("short row {line:?}"));
            let code = col().parse().unwrap_or_else(|e| panic!("{line:?}: {e}"));
            (code, col().to_owned(), col().to_owned())
        })
        .collect()
}

fn xid_on(node: &str, gpu: u32, code: u64) -> Reading {
    Reading {
        node: node.into(),
        gpu: Some(gpu),
        at: 0,
        signal: Signal::Xid(code),
    }
}

#[test]
fn every_code_in_the_catalog_extract_maps_to_the_class_its_resolution_names() {
    let rows = catalog();
    assert!(rows.len() > 50, "the extract is most of the catalog");
    for (code, resolution, description) in &rows {
        assert_eq!(
            xid::class(*code).map(|c| c.bucket()),
            Some(resolution.as_str()),
            "XID {code} ({description})"
        );
    }
    // And the table says nothing the extract does not.
    let extract: Vec<u64> = rows.iter().map(|(c, ..)| *c).collect();
    let table: Vec<u64> = XID_CLASSES.iter().map(|(c, _)| *c).collect();
    assert_eq!(table, extract);
}

#[test]
fn the_table_is_in_strictly_ascending_code_order() {
    // `xid::class` searches it by halves.
    assert!(XID_CLASSES.windows(2).all(|w| w[0].0 < w[1].0));
}

#[test]
fn xid_79_the_gpu_fallen_off_the_bus_takes_the_node() {
    let got = Engine::new(RuleSet::default()).observe(&xid_on("n1", 4, 79));
    assert_eq!(got.len(), 1, "{got:?}");
    let v = &got[0];
    assert_eq!(
        (v.gpu, v.action, v.request, v.change),
        (None, Action::Drain, Some(Request::RebootNode), Change::Fire)
    );
    assert!(v.action.takes_node());
}

#[test]
fn application_faults_13_31_43_alert_the_team_and_touch_no_gpu_or_node() {
    for code in [13, 31, 43] {
        let got = Engine::new(RuleSet::default()).observe(&xid_on("n1", 4, code));
        assert_eq!(got.len(), 1, "XID {code}: {got:?}");
        let v = &got[0];
        assert_eq!(
            (v.gpu, v.action, v.audience, v.request),
            (Some(4), Action::Alert, Audience::Team, None),
            "XID {code}"
        );
    }
}

#[test]
fn reset_class_codes_take_exactly_their_one_gpu_and_ask_for_its_reset() {
    // 95 is RESET_GPU; 48's workflow resets the GPU whether alone or with 63/64.
    for code in [95, 48] {
        let got = Engine::new(RuleSet::default()).observe(&xid_on("n1", 6, code));
        assert_eq!(got.len(), 1, "XID {code}: {got:?}");
        let v = &got[0];
        assert_eq!(
            (v.gpu, v.action, v.request),
            (Some(6), Action::GpuOutOfService, Some(Request::ResetGpu)),
            "XID {code}"
        );
        assert!(!v.action.takes_node());
    }
    // 94 is contained to one application: the catalog restarts the application, not the GPU.
    assert_eq!(xid::remedy(94).action, Action::Alert);
}
