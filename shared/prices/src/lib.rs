//! Allot's price table: what an hour of each resource costs, from which date, in one currency.
//! Billing prices every lease with it; the predictor's right-sizing compares GPU models by it.
//!
//! ```yaml
//! currency: EUR
//! tables:
//!   - effectiveFrom: 2026-01-01T00:00:00Z
//!     gpuHour: {H100: "2.50", A100-80GB: "1.60", L4: "0.45"}   # per whole GPU; fractions pro rata
//!     migHour: {1g.10gb: "0.40"}                               # per MIG instance
//!     cpuCoreHour: "0.04"
//!     memoryGiBHour: "0.005"
//!   - effectiveFrom: 2026-12-01T00:00:00Z                      # a change: leases are split here
//!     gpuHour: {H100: "2.20", A100-80GB: "1.60", L4: "0.45"}
//!     cpuCoreHour: "0.04"
//!     memoryGiBHour: "0.005"
//! ```
//!
//! Prices are decimal strings with at most six decimals, read exactly into integer
//! micro-units; nothing here is floating point. Every problem in a file is reported at once,
//! each with its path.

use std::collections::BTreeMap;
use std::fmt;

use chrono::{DateTime, Utc};
use serde::Deserialize;

/// Micro-units per unit of currency.
pub const MICROS: i64 = 1_000_000;

/// A price table as written.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct File {
    currency: String,
    tables: Vec<TableFile>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct TableFile {
    effective_from: String,
    #[serde(default)]
    gpu_hour: BTreeMap<String, String>,
    #[serde(default)]
    mig_hour: BTreeMap<String, String>,
    cpu_core_hour: String,
    #[serde(default, rename = "memoryGiBHour")]
    memory_gib_hour: Option<String>,
}

/// Prices in force from one instant, in micro-units per hour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prices {
    /// From when (ms since the epoch).
    pub from_ms: u64,
    /// Per whole GPU-hour, by model.
    pub gpu_hour: BTreeMap<String, i64>,
    /// Per MIG-instance-hour, by profile.
    pub mig_hour: BTreeMap<String, i64>,
    /// Per core-hour.
    pub cpu_core_hour: i64,
    /// Per GiB-hour of memory.
    pub memory_gib_hour: i64,
}

/// A validated price table: tables in effective order, the first from the beginning of time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriceTable {
    /// ISO 4217 code.
    pub currency: String,
    /// Ascending by `from_ms`.
    pub tables: Vec<Prices>,
}

/// Everything wrong with a price file (never empty).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct InvalidPrices(pub Vec<String>);

impl fmt::Display for InvalidPrices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid price table: {}", self.0.join("; "))
    }
}

/// Parses `"2.50"` into micro-units: digits, at most one point, at most six decimals, not
/// negative.
pub fn parse_money(text: &str) -> Result<i64, String> {
    let t = text.trim();
    let (whole, frac) = t.split_once('.').unwrap_or((t, ""));
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || (!frac.is_empty() && !digits(frac)) || (t.contains('.') && frac.is_empty())
    {
        return Err(format!("{text:?} is not an amount like \"2.50\""));
    }
    if frac.len() > 6 {
        return Err(format!("{text:?} has more than 6 decimals"));
    }
    let whole: i64 = whole
        .parse()
        .ok()
        .filter(|w| *w < i64::MAX / MICROS)
        .ok_or_else(|| format!("{text:?} is too large"))?;
    let frac: i64 = format!("{frac:0<6}").parse().unwrap_or(0);
    Ok(whole * MICROS + frac)
}

/// Formats micro-units as a decimal amount (`2.500000` → `2.50`, keeping at least two decimals).
pub fn format_money(micros: i64) -> String {
    let sign = if micros < 0 { "-" } else { "" };
    let m = micros.unsigned_abs();
    let whole = m / MICROS as u64;
    let mut frac = format!("{:06}", m % MICROS as u64);
    while frac.len() > 2 && frac.ends_with('0') {
        frac.pop();
    }
    format!("{sign}{whole}.{frac}")
}

/// `text` in micro-units, or 0 with the problem recorded under `field`.
fn money(problems: &mut Vec<String>, field: String, text: &str) -> i64 {
    parse_money(text).unwrap_or_else(|e| {
        problems.push(format!("{field}: {e}"));
        0
    })
}

impl Prices {
    /// The GPU-hour price of `model`: its own entry, else the longest entry its name contains
    /// (case aside), so `H100` prices an NVML `NVIDIA H100 80GB HBM3`.
    pub fn gpu(&self, model: &str) -> Option<i64> {
        if let Some(p) = self.gpu_hour.get(model) {
            return Some(*p);
        }
        let lower = model.to_ascii_lowercase();
        self.gpu_hour
            .iter()
            .filter(|(key, _)| lower.contains(&key.to_ascii_lowercase()))
            .max_by_key(|(key, _)| key.len())
            .map(|(_, p)| *p)
    }
}

impl PriceTable {
    /// Reads a price file (YAML or JSON), reporting every problem at once.
    pub fn parse(text: &str) -> Result<PriceTable, InvalidPrices> {
        let file: File =
            yaml_serde::from_str(text).map_err(|e| InvalidPrices(vec![e.to_string()]))?;
        let mut problems = Vec::new();
        let currency = file.currency.trim().to_owned();
        if currency.len() != 3 || !currency.bytes().all(|b| b.is_ascii_uppercase()) {
            problems.push(format!(
                "currency: {currency:?} is not an ISO 4217 code like \"EUR\""
            ));
        }
        if file.tables.is_empty() {
            problems.push("tables: name at least one price table".into());
        }
        let mut tables = Vec::new();
        for (i, t) in file.tables.iter().enumerate() {
            let at = |field: &str| format!("tables[{i}].{field}");
            let from_ms = match DateTime::parse_from_rfc3339(&t.effective_from) {
                Ok(d) => d.with_timezone(&Utc).timestamp_millis().max(0) as u64,
                Err(e) => {
                    problems.push(format!(
                        "{}: {:?} is not an RFC 3339 time ({e})",
                        at("effectiveFrom"),
                        t.effective_from
                    ));
                    0
                }
            };
            let gpu_hour = t
                .gpu_hour
                .iter()
                .map(|(m, p)| {
                    (
                        m.clone(),
                        money(&mut problems, at(&format!("gpuHour.{m}")), p),
                    )
                })
                .collect();
            let mig_hour = t
                .mig_hour
                .iter()
                .map(|(m, p)| {
                    (
                        m.clone(),
                        money(&mut problems, at(&format!("migHour.{m}")), p),
                    )
                })
                .collect();
            let cpu_core_hour = money(&mut problems, at("cpuCoreHour"), &t.cpu_core_hour);
            let memory = t.memory_gib_hour.as_ref();
            let memory_gib_hour = match memory {
                Some(p) => money(&mut problems, at("memoryGiBHour"), p),
                None => {
                    problems.push(format!("{}: missing", at("memoryGiBHour")));
                    0
                }
            };
            if let Some(prev) = tables.last().map(|p: &Prices| p.from_ms)
                && from_ms <= prev
            {
                problems.push(format!(
                    "{}: {} is not after the previous table's; list tables in effective order",
                    at("effectiveFrom"),
                    t.effective_from
                ));
            }
            tables.push(Prices {
                from_ms,
                gpu_hour,
                mig_hour,
                cpu_core_hour,
                memory_gib_hour,
            });
        }
        if !problems.is_empty() {
            return Err(InvalidPrices(problems));
        }
        Ok(PriceTable { currency, tables })
    }

    /// The prices in force at `t` (before the first table: the first table's).
    pub fn at(&self, t: u64) -> &Prices {
        let i = self.tables.partition_point(|p| p.from_ms <= t);
        &self.tables[i.saturating_sub(1)]
    }

    /// The first price change strictly after `t`, if any.
    pub fn next_change(&self, t: u64) -> Option<u64> {
        self.tables.iter().map(|p| p.from_ms).find(|f| *f > t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_are_read_exactly_into_micro_units_or_refused_with_the_reason() {
        let cases: [(&str, Result<i64, &str>); 8] = [
            ("2.50", Ok(2_500_000)),
            ("0.000001", Ok(1)),
            ("17", Ok(17_000_000)),
            ("0.1", Ok(100_000)),
            ("1.0000001", Err("more than 6 decimals")),
            ("-1", Err("not an amount")),
            ("1.", Err("not an amount")),
            ("1e3", Err("not an amount")),
        ];
        for (text, want) in cases {
            match (parse_money(text), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{text}"),
                (Err(e), Err(want)) => assert!(e.contains(want), "{text}: {e}"),
                (got, want) => panic!("{text}: {got:?}, want {want:?}"),
            }
        }
        assert_eq!(format_money(2_500_000), "2.50");
        assert_eq!(format_money(1), "0.000001");
        assert_eq!(format_money(-83_333), "-0.083333");
    }

    #[test]
    fn every_problem_in_a_price_file_is_listed_with_its_path() {
        let text = r#"
currency: euro
tables:
  - effectiveFrom: 2026-12-01T00:00:00Z
    gpuHour: {H100: "2.5.0"}
    cpuCoreHour: "-1"
    memoryGiBHour: "0.005"
  - effectiveFrom: 2026-01-01T00:00:00Z
    cpuCoreHour: "0.04"
"#;
        let err = PriceTable::parse(text).unwrap_err();
        let all = err.to_string();
        for want in [
            "currency: \"euro\" is not an ISO 4217 code",
            "tables[0].gpuHour.H100: \"2.5.0\" is not an amount",
            "tables[0].cpuCoreHour: \"-1\" is not an amount",
            "tables[1].memoryGiBHour: missing",
            "tables[1].effectiveFrom: 2026-01-01T00:00:00Z is not after the previous table's",
        ] {
            assert!(all.contains(want), "{want:?} missing from {all}");
        }
        assert_eq!(err.0.len(), 5, "{all}");
    }

    #[test]
    fn the_table_in_force_is_the_last_one_started() {
        let table = PriceTable::parse(
            r#"
currency: EUR
tables:
  - {effectiveFrom: "1970-01-01T00:00:01Z", cpuCoreHour: "1", memoryGiBHour: "0"}
  - {effectiveFrom: "1970-01-01T00:00:10Z", cpuCoreHour: "2", memoryGiBHour: "0"}
"#,
        )
        .unwrap();
        let cases = [(0, 1), (1_000, 1), (9_999, 1), (10_000, 2), (99_999, 2)];
        for (t, want) in cases {
            assert_eq!(table.at(t).cpu_core_hour, want * MICROS, "at {t}");
        }
        assert_eq!(table.next_change(1_000), Some(10_000));
        let mut gpus = table.at(0).clone();
        gpus.gpu_hour = BTreeMap::from([
            ("A100".into(), 1),
            ("A100-80GB".into(), 2),
            ("H100".into(), 3),
        ]);
        let cases = [
            ("H100", Some(3)),
            ("NVIDIA H100 80GB HBM3", Some(3)),
            ("NVIDIA A100-SXM4-40GB", Some(1)),
            ("a100-80gb", Some(2)),
            ("L4", None),
        ];
        for (model, want) in cases {
            assert_eq!(gpus.gpu(model), want, "{model}");
        }
        assert_eq!(table.next_change(10_000), None);
    }
}
