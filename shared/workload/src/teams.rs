//! The teams file: which teams exist and which priority classes workloads may name.
//!
//! ```yaml
//! teams:
//!   - name: vision
//!     quota: { gpus: 16 }
//!   - name: nlp
//! priorityClasses: { batch: 0, standard: 100, critical: 1000 }   # the defaults
//! defaultPriorityClass: standard                                 # the default
//! ```
//!
//! One file for everything per team: quotas (and, later, NATS accounts and budgets) hang off
//! each entry, so billing and the allocator read the same list `allot validate` checks against.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use allot_events::subject::validate_token;
use allot_sched::quota::Quota;

/// The teams file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TeamsConfig {
    /// Every team that may submit workloads.
    #[serde(default)]
    pub teams: Vec<Team>,
    /// Priority classes by name → priority (higher is more important).
    #[serde(default = "default_classes")]
    pub priority_classes: BTreeMap<String, i32>,
    /// The class of a workload that names none.
    #[serde(default = "default_class")]
    pub default_priority_class: String,
}

/// One team.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Team {
    /// The team's name: a subject token (`allot.workload.submitted.<team>`).
    pub name: String,
    /// Its share of the pool, when it has one: the scheduler's own quota type, written in
    /// whole GPUs in the file (`{gpus: 16, borrowingLimit: 8, lendingLimit: 4}`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "quota_in_gpus"
    )]
    pub quota: Option<Quota>,
    /// Its spending limit per period, when it has one (billing watches it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
}

/// A budget period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BudgetPeriod {
    /// A calendar day, UTC.
    Day,
    /// A calendar month, UTC.
    #[default]
    Month,
}

/// A team's spending limit: money or GPU-hours per period. Billing announces 80% (warning) and
/// 100% (exceeded); while exceeded, the allocator starts none of the team's new work below
/// `blockBelow` — or, without it, starts it and flags the grant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Budget {
    /// The period it renews on (default `month`).
    #[serde(default)]
    pub period: BudgetPeriod,
    /// Money per period, in the price table's currency (`"5000.00"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amount: Option<String>,
    /// GPU-hours per period (fractions count pro rata).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_hours: Option<u64>,
    /// While exceeded: the lowest priority class still started; absent: allow and flag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_below: Option<String>,
}

/// A quota as the teams file writes it: whole GPUs, Kueue's nominal, borrowing and lending
/// limits. Read into and written from [`Quota`], the one quota type (milli-GPU inside).
mod quota_in_gpus {
    use allot_sched::model::WHOLE_GPU_MILLI;
    use allot_sched::quota::Quota;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct InGpus {
        /// GPUs the team is entitled to.
        gpus: u32,
        /// GPUs it may use beyond that when others' are idle; absent: no limit.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        borrowing_limit: Option<u32>,
        /// GPUs of its own it may lend out; absent: all.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lending_limit: Option<u32>,
    }

    const MILLI: u64 = WHOLE_GPU_MILLI as u64;

    pub fn serialize<S: Serializer>(quota: &Option<Quota>, s: S) -> Result<S::Ok, S::Error> {
        quota
            .as_ref()
            .map(|q| InGpus {
                gpus: (q.nominal_milli / MILLI) as u32,
                borrowing_limit: q.borrowing_limit_milli.map(|m| (m / MILLI) as u32),
                lending_limit: q.lending_limit_milli.map(|m| (m / MILLI) as u32),
            })
            .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Quota>, D::Error> {
        Ok(Option::<InGpus>::deserialize(d)?.map(|q| Quota {
            nominal_milli: u64::from(q.gpus) * MILLI,
            borrowing_limit_milli: q.borrowing_limit.map(|g| u64::from(g) * MILLI),
            lending_limit_milli: q.lending_limit.map(|g| u64::from(g) * MILLI),
            ..Quota::default()
        }))
    }
}

fn default_classes() -> BTreeMap<String, i32> {
    [("batch", 0), ("standard", 100), ("critical", 1000)]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
}

fn default_class() -> String {
    "standard".to_owned()
}

impl Default for TeamsConfig {
    /// No teams listed (teams are not checked) and the default priority classes.
    fn default() -> Self {
        Self {
            teams: Vec::new(),
            priority_classes: default_classes(),
            default_priority_class: default_class(),
        }
    }
}

/// Why a teams file cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid teams file:\n  - {}", .0.join("\n  - "))]
pub struct InvalidTeams(pub Vec<String>);

impl TeamsConfig {
    /// Reads a teams file (YAML or JSON) and checks it, reporting every problem at once.
    pub fn from_yaml(text: &str) -> Result<Self, InvalidTeams> {
        let config: TeamsConfig =
            yaml_serde::from_str(text).map_err(|e| InvalidTeams(vec![e.to_string()]))?;
        config.check()?;
        Ok(config)
    }

    /// Team names are subject tokens and unique; the default class exists.
    pub fn check(&self) -> Result<(), InvalidTeams> {
        let mut problems = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for (i, team) in self.teams.iter().enumerate() {
            if let Err(e) = validate_token("team", &team.name) {
                problems.push(format!("teams[{i}].name: {e}"));
            }
            if let Some(b) = &team.budget {
                let at = format!("teams[{i}].budget");
                match (&b.amount, b.gpu_hours) {
                    (Some(_), Some(_)) | (None, None) => problems.push(format!(
                        "{at}: give exactly one of amount (money) and gpuHours"
                    )),
                    (Some(a), None) => {
                        let (whole, frac) = a.split_once('.').unwrap_or((a, ""));
                        let digits = |t: &str| t.bytes().all(|c| c.is_ascii_digit());
                        if whole.is_empty() || !digits(whole) || !digits(frac) || frac.len() > 6 {
                            problems.push(format!(
                                "{at}.amount: {a:?} is not an amount like \"5000.00\""
                            ));
                        }
                    }
                    (None, Some(0)) => problems.push(format!("{at}.gpuHours: must be above 0")),
                    (None, Some(_)) => {}
                }
                if let Some(class) = &b.block_below
                    && !self.priority_classes.contains_key(class)
                {
                    problems.push(format!(
                        "{at}.blockBelow: {class:?} is not one of the priorityClasses ({})",
                        self.class_list()
                    ));
                }
            }
            if !seen.insert(team.name.as_str()) {
                problems.push(format!(
                    "teams[{i}].name: team {:?} is listed twice",
                    team.name
                ));
            }
        }
        if self.priority_classes.is_empty() {
            problems.push("priorityClasses: at least one class is needed".to_owned());
        }
        if !self
            .priority_classes
            .contains_key(&self.default_priority_class)
        {
            problems.push(format!(
                "defaultPriorityClass: {:?} is not one of the priorityClasses ({})",
                self.default_priority_class,
                self.class_list()
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(InvalidTeams(problems))
        }
    }

    /// Whether teams are checked at all (a file that lists none checks none).
    pub fn lists_teams(&self) -> bool {
        !self.teams.is_empty()
    }

    /// Each team's quota, for the allocator (teams without one are not under quota).
    pub fn quotas(&self) -> Vec<(String, Quota)> {
        self.teams
            .iter()
            .filter_map(|t| Some((t.name.clone(), t.quota?)))
            .collect()
    }

    /// The team called `name`.
    pub fn team(&self, name: &str) -> Option<&Team> {
        self.teams.iter().find(|t| t.name == name)
    }

    /// The priority of class `name` (the default class for `None`), if the class exists.
    pub fn priority(&self, class: Option<&str>) -> Option<i32> {
        self.priority_classes
            .get(class.unwrap_or(&self.default_priority_class))
            .copied()
    }

    /// `batch (0), standard (100), critical (1000)`, by priority.
    pub fn class_list(&self) -> String {
        let mut classes: Vec<(&String, &i32)> = self.priority_classes.iter().collect();
        classes.sort_by_key(|(name, p)| (**p, (*name).clone()));
        classes
            .iter()
            .map(|(name, p)| format!("{name} ({p})"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_teams_file_defaults_its_priority_classes_and_reports_every_bad_name() {
        let config =
            TeamsConfig::from_yaml("teams:\n  - name: vision\n    quota: {gpus: 16}\n").unwrap();
        assert_eq!(config.priority(None), Some(100));
        assert_eq!(config.priority(Some("critical")), Some(1000));
        assert_eq!(
            config.team("vision").unwrap().quota,
            Some(Quota::gpus(16_000))
        );

        let err = TeamsConfig::from_yaml(
            "teams: [{name: a.b}, {name: x}, {name: x}]\npriorityClasses: {low: 1}\n",
        )
        .unwrap_err();
        assert_eq!(err.0.len(), 3, "{err}");
        assert!(err.0[0].starts_with("teams[0].name: team \"a.b\" is not a valid name"));
        assert_eq!(err.0[1], "teams[2].name: team \"x\" is listed twice");
        assert_eq!(
            err.0[2],
            "defaultPriorityClass: \"standard\" is not one of the priorityClasses (low (1))"
        );
    }

    #[test]
    fn budgets_name_one_limit_and_a_known_class() {
        let ok = TeamsConfig::from_yaml(
            "teams:\n  - name: vision\n    budget: {amount: \"5000.00\", blockBelow: standard}\n",
        )
        .unwrap();
        let b = ok.team("vision").unwrap().budget.clone().unwrap();
        assert_eq!(
            (b.period, b.block_below.as_deref()),
            (BudgetPeriod::Month, Some("standard"))
        );
        let err = TeamsConfig::from_yaml(
            "teams:\n  - {name: a, budget: {amount: \"5,000\"}}\n  - {name: b, budget: {amount: \"1\", gpuHours: 3}}\n  - {name: c, budget: {gpuHours: 3, blockBelow: urgent}}\n",
        )
        .unwrap_err();
        assert_eq!(err.0.len(), 3, "{err}");
        assert!(
            err.0[0].starts_with("teams[0].budget.amount: \"5,000\""),
            "{err}"
        );
        assert!(
            err.0[1].starts_with("teams[1].budget: give exactly one"),
            "{err}"
        );
        assert!(
            err.0[2].starts_with("teams[2].budget.blockBelow: \"urgent\""),
            "{err}"
        );
    }
}
