//! YAML or JSON text → [`Workload`], with every structural problem at once.
//!
//! Deserializing straight into the types would stop at the first unknown field. Instead the text
//! is read into a JSON value (syntax errors carry line and column), checked against the spec's
//! JSON Schema — the same one committed as `schemas/workload.v1.json` — which reports every
//! unknown field, wrong type and missing field with its path, and only then deserialized.
//! Unknown fields are dropped after being reported, so the semantic checks of
//! [`crate::validate`] still run on the rest and a spec's problems all come out in one go.

use std::sync::OnceLock;

use jsonschema::error::ValidationErrorKind;
use jsonschema::paths::LocationSegment;
use serde_json::Value;

use allot_events::workload::Workload;

use crate::problem::{ProblemKind, SpecProblem};

/// The text's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// YAML (1.1, as libyaml reads it).
    Yaml,
    /// JSON.
    Json,
}

impl Format {
    /// JSON for a `.json` file, YAML for anything else (`.yaml`, `.yml`, stdin).
    pub fn from_path(path: &std::path::Path) -> Self {
        match path.extension().and_then(|e| e.to_str()) {
            Some(ext) if ext.eq_ignore_ascii_case("json") => Self::Json,
            _ => Self::Yaml,
        }
    }
}

/// What [`parse`] made of the text: the workload, if it could be built, and every structural
/// problem found on the way (a workload with only unknown fields dropped is still returned).
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    /// The workload, unless a problem other than an unknown field prevented building it.
    pub workload: Option<Workload>,
    /// Every structural problem.
    pub problems: Vec<SpecProblem>,
}

/// Reads a workload from `text`.
pub fn parse(text: &str, format: Format) -> Parsed {
    let value = match read_value(text, format) {
        Ok(value) => value,
        Err(problem) => {
            return Parsed {
                workload: None,
                problems: vec![problem],
            };
        }
    };
    let mut problems = Vec::new();
    let mut cleaned = value.clone();
    let mut only_unknown_fields = true;
    let mut unknown = Vec::new();
    for error in validator().iter_errors(&value) {
        let segments: Vec<Segment> = error
            .instance_path
            .into_iter()
            .map(|s| match s {
                LocationSegment::Property(p) => Segment::Key(p.into_owned()),
                LocationSegment::Index(i) => Segment::Index(i),
            })
            .collect();
        match &error.kind {
            ValidationErrorKind::AdditionalProperties { unexpected } => {
                for field in unexpected {
                    let mut path = segments.clone();
                    path.push(Segment::Key(field.clone()));
                    let known = known_fields(&segments);
                    let hint = closest(field, &known)
                        .map(|k| format!(" (did you mean {k:?}?)"))
                        .unwrap_or_default();
                    let message = if known.is_empty() {
                        format!("unknown field {field:?}{hint}")
                    } else {
                        format!(
                            "unknown field {field:?}{hint}; known fields: {}",
                            known.join(", ")
                        )
                    };
                    problems.push(problem_at(
                        &value,
                        ProblemKind::UnknownField,
                        &path,
                        message,
                    ));
                    unknown.push(path);
                }
            }
            kind => {
                only_unknown_fields = false;
                problems.push(problem_at(
                    &value,
                    ProblemKind::Structure,
                    &segments,
                    structure_message(kind, &error.instance),
                ));
            }
        }
    }
    // Deepest first, so removing a field never shifts the path of another.
    unknown.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for path in &unknown {
        remove(&mut cleaned, path);
    }
    let workload = if only_unknown_fields {
        match serde_json::from_value::<Workload>(cleaned) {
            Ok(w) => Some(w),
            Err(e) => {
                // The schema and the types disagree only on what JSON Schema cannot say
                // (a number too large for its type, for example).
                problems.push(SpecProblem::new(ProblemKind::Structure, "", e.to_string()));
                None
            }
        }
    } else {
        None
    };
    Parsed { workload, problems }
}

fn read_value(text: &str, format: Format) -> Result<Value, SpecProblem> {
    match format {
        Format::Json => serde_json::from_str(text).map_err(|e| {
            let mut p = SpecProblem::new(
                ProblemKind::Syntax,
                "",
                format!("not valid JSON: {}", strip_location(&e.to_string())),
            );
            p.line_column = Some((e.line(), e.column()));
            p
        }),
        Format::Yaml => {
            let syntax = |e: yaml_serde::Error| {
                let mut p = SpecProblem::new(
                    ProblemKind::Syntax,
                    "",
                    format!("not valid YAML: {}", strip_location(&e.to_string())),
                );
                p.line_column = e.location().map(|l| (l.line(), l.column()));
                p
            };
            // Merge keys (`<<: *trainer`) are applied first: gangs of identical members are
            // written that way.
            let mut yaml: yaml_serde::Value = yaml_serde::from_str(text).map_err(syntax)?;
            yaml.apply_merge().map_err(syntax)?;
            yaml_serde::from_value(yaml).map_err(syntax)
        }
    }
}

/// Messages of serde_json and the YAML reader end in " at line L column C"; the location is
/// kept in the problem's own field instead.
fn strip_location(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(i) => message[..i].to_owned(),
        None => message.to_owned(),
    }
}

fn validator() -> &'static jsonschema::Validator {
    static VALIDATOR: OnceLock<jsonschema::Validator> = OnceLock::new();
    VALIDATOR.get_or_init(|| {
        jsonschema::validator_for(&allot_events::schema::workload_spec())
            .expect("the workload spec schema generated from the types is valid")
    })
}

/// One step of a path into the document.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Key(String),
    Index(usize),
}

/// `spec.tasks[2].after[0]`.
fn render(path: &[Segment]) -> String {
    let mut out = String::new();
    for s in path {
        match s {
            Segment::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Segment::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

fn problem_at(
    document: &Value,
    kind: ProblemKind,
    path: &[Segment],
    message: String,
) -> SpecProblem {
    let mut problem = SpecProblem::new(kind, render(path), message);
    if let [
        Segment::Key(spec),
        Segment::Key(tasks),
        Segment::Index(i),
        ..,
    ] = path
        && spec == "spec"
        && tasks == "tasks"
        && let Some(name) = document["spec"]["tasks"][*i]["name"].as_str()
    {
        problem.task = Some(name.to_owned());
    }
    problem
}

fn structure_message(kind: &ValidationErrorKind, instance: &Value) -> String {
    match kind {
        ValidationErrorKind::Required { property } => {
            format!("missing field {}", property)
        }
        ValidationErrorKind::Type { kind } => {
            let want = match kind {
                jsonschema::error::TypeKind::Single(t) => t.to_string(),
                jsonschema::error::TypeKind::Multiple(ts) => ts
                    .iter()
                    .map(|t| t.to_string())
                    .collect::<Vec<_>>()
                    .join(" or "),
            };
            format!(
                "expected {want}, found {} {}",
                json_kind(instance),
                compact(instance)
            )
        }
        ValidationErrorKind::Constant { expected_value } => {
            format!("must be {expected_value}, found {}", compact(instance))
        }
        ValidationErrorKind::Minimum { limit } => {
            format!("must be at least {limit}, found {}", compact(instance))
        }
        ValidationErrorKind::Maximum { limit } => {
            format!("must be at most {limit}, found {}", compact(instance))
        }
        other => format!("{} (found {})", describe(other), compact(instance)),
    }
}

fn describe(kind: &ValidationErrorKind) -> String {
    format!("{kind:?}")
        .split_whitespace()
        .next()
        .unwrap_or("invalid")
        .to_owned()
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// A short rendering of a value for a message.
fn compact(v: &Value) -> String {
    let text = v.to_string();
    if text.chars().count() > 40 {
        format!("{}…", text.chars().take(40).collect::<String>())
    } else {
        text
    }
}

/// The fields the schema allows at `path` (an object in the document), sorted.
fn known_fields(path: &[Segment]) -> Vec<String> {
    let root = allot_events::schema::workload_spec();
    let mut at = &root;
    for segment in path {
        at = resolve(&root, at);
        at = match segment {
            Segment::Key(k) => match at.get("properties").and_then(|p| p.get(k)) {
                Some(s) => s,
                None => return Vec::new(),
            },
            Segment::Index(_) => match at.get("items") {
                Some(s) => s,
                None => return Vec::new(),
            },
        };
    }
    let at = resolve(&root, at);
    let mut known: Vec<String> = at
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default();
    known.sort();
    known
}

/// Follows `$ref: "#/$defs/X"`.
fn resolve<'a>(root: &'a Value, schema: &'a Value) -> &'a Value {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(r) => r
            .strip_prefix("#/$defs/")
            .and_then(|name| root.get("$defs")?.get(name))
            .unwrap_or(schema),
        None => schema,
    }
}

/// The known field closest to a misspelt one, if it is close enough to be the likely intent.
fn closest<'a>(field: &str, known: &'a [String]) -> Option<&'a str> {
    known
        .iter()
        .map(|k| (edit_distance(&field.to_lowercase(), &k.to_lowercase()), k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 4))
        // Among equally close names, one the typo is the start of (`gpu` → `gpus`).
        .min_by_key(|(d, k)| (*d, !k.starts_with(field)))
        .map(|(_, k)| k.as_str())
}

/// Levenshtein distance.
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

fn remove(document: &mut Value, path: &[Segment]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut at = document;
    for segment in parents {
        at = match (segment, at) {
            (Segment::Key(k), Value::Object(map)) => match map.get_mut(k) {
                Some(v) => v,
                None => return,
            },
            (Segment::Index(i), Value::Array(items)) => match items.get_mut(*i) {
                Some(v) => v,
                None => return,
            },
            _ => return,
        };
    }
    if let (Segment::Key(k), Value::Object(map)) = (last, at) {
        map.remove(k);
    }
}
