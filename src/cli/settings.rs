//! Settings from flags and `ALLOT_*` environment variables, with every problem reported at once.
//!
//! A flag wins over its variable, which wins over the default. The environment is read through
//! an injected lookup so tests never touch the process environment.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// Reads an environment variable.
pub type Lookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process environment as a [`Lookup`].
pub fn process_env(key: &str) -> Option<String> {
    std::env::var(key).ok()
}

/// Every invalid setting, one per line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidSettings(pub Vec<String>);

impl fmt::Display for InvalidSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        let noun = if n == 1 { "problem" } else { "problems" };
        writeln!(f, "invalid configuration ({n} {noun}):")?;
        for problem in &self.0 {
            writeln!(f, "  - {problem}")?;
        }
        Ok(())
    }
}

impl std::error::Error for InvalidSettings {}

/// Collects settings and their problems.
pub struct Settings<'a> {
    env: Lookup<'a>,
    problems: Vec<String>,
}

impl<'a> Settings<'a> {
    /// Settings reading variables through `env`.
    pub fn new(env: Lookup<'a>) -> Self {
        Self {
            env,
            problems: Vec::new(),
        }
    }

    /// The raw value of `--flag` or `ALLOT_<VAR>`, whichever is set (flag first).
    pub fn raw(&self, flag: Option<&str>, var: &str) -> Option<(String, String)> {
        match flag {
            Some(v) => Some((format!("--{}", flag_name(var)), v.to_owned())),
            None => (self.env)(var).map(|v| (var.to_owned(), v)),
        }
    }

    /// A string setting.
    pub fn string(&mut self, flag: Option<&str>, var: &str, default: &str) -> String {
        self.raw(flag, var)
            .map(|(_, v)| v)
            .unwrap_or_else(|| default.to_owned())
    }

    /// An optional string setting.
    pub fn optional(&mut self, flag: Option<&str>, var: &str) -> Option<String> {
        self.raw(flag, var)
            .map(|(_, v)| v)
            .filter(|v| !v.is_empty())
    }

    /// A parsed setting; a bad value is recorded and the default returned.
    pub fn parse<T>(&mut self, flag: Option<&str>, var: &str, default: T) -> T
    where
        T: FromStr,
        T::Err: fmt::Display,
    {
        match self.raw(flag, var) {
            None => default,
            Some((origin, v)) => match v.trim().parse() {
                Ok(t) => t,
                Err(e) => {
                    self.problems.push(format!("{origin}={v:?}: {e}"));
                    default
                }
            },
        }
    }

    /// A duration like `500ms`, `5s` or `2m`.
    pub fn duration(&mut self, flag: Option<&str>, var: &str, default: Duration) -> Duration {
        match self.raw(flag, var) {
            None => default,
            Some((origin, v)) => match humantime::parse_duration(v.trim()) {
                Ok(d) if !d.is_zero() => d,
                Ok(_) => {
                    self.problems
                        .push(format!("{origin}={v:?}: must be longer than zero"));
                    default
                }
                Err(e) => {
                    self.problems
                        .push(format!("{origin}={v:?}: {e} (try e.g. 500ms, 5s, 2m)"));
                    default
                }
            },
        }
    }

    /// Records a problem found while checking values against each other.
    pub fn problem(&mut self, problem: impl Into<String>) {
        self.problems.push(problem.into());
    }

    /// `Ok` if every setting was valid, else all problems.
    pub fn finish(self) -> Result<(), InvalidSettings> {
        if self.problems.is_empty() {
            Ok(())
        } else {
            Err(InvalidSettings(self.problems))
        }
    }
}

/// `ALLOT_SIM_NODES` → `sim-nodes`.
fn flag_name(var: &str) -> String {
    var.trim_start_matches("ALLOT_")
        .to_lowercase()
        .replace('_', "-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_beat_variables_and_every_bad_value_is_reported_at_once() {
        let env = |k: &str| match k {
            "ALLOT_SIM_NODES" => Some("lots".to_owned()),
            "ALLOT_SIM_GPUS" => Some("4".to_owned()),
            "ALLOT_HEARTBEAT_INTERVAL" => Some("5 parsecs".to_owned()),
            "ALLOT_DATA_DIR" => Some("/var/lib/allot".to_owned()),
            _ => None,
        };
        let mut s = Settings::new(&env);
        let nodes: u32 = s.parse(None, "ALLOT_SIM_NODES", 4);
        let gpus: u32 = s.parse(Some("8"), "ALLOT_SIM_GPUS", 1);
        let hb = s.duration(None, "ALLOT_HEARTBEAT_INTERVAL", Duration::from_secs(5));
        let tick = s.duration(Some("0s"), "ALLOT_CHECK_INTERVAL", Duration::from_secs(1));
        let dir = s.string(None, "ALLOT_DATA_DIR", ".allot");
        assert_eq!((nodes, gpus, dir.as_str()), (4, 8, "/var/lib/allot"));
        assert_eq!((hb, tick), (Duration::from_secs(5), Duration::from_secs(1)));
        let err = s.finish().unwrap_err();
        assert_eq!(err.0.len(), 3, "{err}");
        let text = err.to_string();
        assert!(text.contains("ALLOT_SIM_NODES=\"lots\""), "{text}");
        assert!(
            text.contains("ALLOT_HEARTBEAT_INTERVAL=\"5 parsecs\""),
            "{text}"
        );
        assert!(
            text.contains("--check-interval=\"0s\": must be longer than zero"),
            "{text}"
        );
    }
}
