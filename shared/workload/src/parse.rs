//! YAML or JSON text → [`Workload`], with every structural problem at once.
//!
//! Deserializing straight into the types would stop at the first unknown field. Instead the text
//! is read into a JSON value (syntax errors carry line and column), checked against the spec's
//! JSON Schema — the same one committed as `schemas/workload.v1.json` — which reports every
//! unknown field, wrong type and missing field with its path, and only then deserialized.
//! Unknown fields are dropped after being reported, so the semantic checks of
//! [`crate::validate`] still run on the rest and a spec's problems all come out in one go.
//!
//! What the JSON value would hide is reported first, by path: a key a JSON object gives twice
//! (YAML refuses those as a syntax error) and a YAML number that is not finite (`.nan`, `.inf`,
//! which JSON would make null).

use std::cell::RefCell;
use std::sync::OnceLock;

use jsonschema::error::ValidationErrorKind;
use jsonschema::paths::LocationSegment;
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
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
    let Read { value, flaws } = match read_value(text, format) {
        Ok(read) => read,
        Err(problem) => {
            return Parsed {
                workload: None,
                problems: vec![problem],
            };
        }
    };
    let mut problems: Vec<SpecProblem> = flaws.iter().map(|flaw| flaw.problem(&value)).collect();
    let mut cleaned = value.clone();
    let mut only_unknown_fields = flaws.is_empty();
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
        // A number that is not finite is null in JSON: its flaw already says what it was.
        if flaws
            .iter()
            .any(|f| matches!(f, Flaw::NotFinite { path, .. } if *path == segments))
        {
            only_unknown_fields = false;
            continue;
        }
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
                let expected = segments.last().and_then(expected_number);
                problems.push(problem_at(
                    &value,
                    ProblemKind::Structure,
                    &segments,
                    structure_message(kind, &error.instance, expected),
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

/// The document as a JSON value, and what is wrong with it that the value cannot show.
struct Read {
    value: Value,
    flaws: Vec<Flaw>,
}

/// Something the text says that its JSON value loses.
#[derive(Debug)]
enum Flaw {
    /// A JSON object gives this key (the path's last segment) more than once.
    DuplicateKey(Vec<Segment>),
    /// A YAML number that is not finite (`.nan`, `.inf`), written here as it was; JSON has no
    /// such numbers, so the value holds null.
    NotFinite { path: Vec<Segment>, written: String },
}

impl Flaw {
    fn problem(&self, document: &Value) -> SpecProblem {
        match self {
            Flaw::DuplicateKey(path) => {
                let key = match path.last() {
                    Some(Segment::Key(k)) => k.as_str(),
                    _ => "",
                };
                problem_at(
                    document,
                    ProblemKind::Syntax,
                    path,
                    format!(
                        "duplicate key {key:?}: this object gives it more than once; give each \
                         key once"
                    ),
                )
            }
            Flaw::NotFinite { path, written } => {
                let expected = path
                    .last()
                    .and_then(expected_number)
                    .unwrap_or("a finite number or a quantity such as \"500m\"");
                problem_at(
                    document,
                    ProblemKind::Structure,
                    path,
                    format!("{written} is not a finite number; expected {expected}"),
                )
            }
        }
    }
}

/// What a numeric field takes, for messages about a value that is not one.
fn expected_number(field: &Segment) -> Option<&'static str> {
    let Segment::Key(field) = field else {
        return None;
    };
    Some(match field.as_str() {
        "gpus" => "a whole number of GPUs, e.g. 4",
        "gpuFraction" => "a share of one GPU between 0 and 1 (exclusive), e.g. \"0.25\"",
        "gpuMilli" => "thousandths of one GPU, 1 to 999, e.g. 250",
        "cpu" => "cores (\"16\", \"0.5\") or millicores (\"500m\")",
        "memory" | "gpuMemory" => {
            "bytes with a suffix Ki, Mi, Gi, Ti (or k, M, G, T), e.g. \"64Gi\""
        }
        "maxAttempts" => "the number of runs in all, 1 or more, e.g. 3",
        _ => return None,
    })
}

fn read_value(text: &str, format: Format) -> Result<Read, SpecProblem> {
    match format {
        Format::Json => read_json(text).map_err(|e| {
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
            let mut flaws = Vec::new();
            not_finite(&yaml, &mut Vec::new(), &mut flaws);
            let value = yaml_serde::from_value(yaml).map_err(syntax)?;
            Ok(Read { value, flaws })
        }
    }
}

/// Every number in a YAML document that is not finite; JSON would make each of them null.
fn not_finite(yaml: &yaml_serde::Value, path: &mut Vec<Segment>, out: &mut Vec<Flaw>) {
    match yaml {
        yaml_serde::Value::Number(n) if n.is_nan() || n.is_infinite() => {
            out.push(Flaw::NotFinite {
                path: path.clone(),
                written: n.to_string(),
            })
        }
        yaml_serde::Value::Sequence(items) => {
            for (i, item) in items.iter().enumerate() {
                path.push(Segment::Index(i));
                not_finite(item, path, out);
                path.pop();
            }
        }
        yaml_serde::Value::Mapping(map) => {
            for (key, item) in map {
                // Only string keys become fields; the schema reports the others.
                if let Some(key) = key.as_str() {
                    path.push(Segment::Key(key.to_owned()));
                    not_finite(item, path, out);
                    path.pop();
                }
            }
        }
        yaml_serde::Value::Tagged(tagged) => not_finite(&tagged.value, path, out),
        _ => {}
    }
}

/// JSON text → value, noting every key an object gives twice.
///
/// serde_json keeps the last of two equal keys and has no option to refuse them, while YAML
/// refuses them — so `{"team":"vision","team":"nlp"}` would be submitted as `nlp`. Rather than
/// parse JSON by hand, serde_json's own parser reads the text (so syntax errors, escapes,
/// numbers and the depth limit are exactly serde_json's, with line and column) and only the
/// building of the value is ours: [`JsonSeed`] builds the same `Value` and records each
/// repeated key with its path, so every duplicate is reported at once, by path and task like
/// any other problem. Reading JSON through the YAML parser, which refuses duplicates, was the
/// other way; but YAML 1.1 reads some JSON differently (escapes such as `\/`, tabs, `1e3`) and
/// would call a JSON syntax error a YAML one.
fn read_json(text: &str) -> Result<Read, serde_json::Error> {
    let duplicates = RefCell::new(Vec::new());
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let value = JsonSeed {
        path: &[],
        duplicates: &duplicates,
    }
    .deserialize(&mut deserializer)?;
    deserializer.end()?;
    let flaws = duplicates
        .into_inner()
        .into_iter()
        .map(Flaw::DuplicateKey)
        .collect();
    Ok(Read { value, flaws })
}

/// Builds a `serde_json::Value` at `path`, recording repeated keys in `duplicates` (the
/// first of them is kept).
struct JsonSeed<'a> {
    path: &'a [Segment],
    duplicates: &'a RefCell<Vec<Vec<Segment>>>,
}

impl JsonSeed<'_> {
    fn at(&self, segment: Segment) -> Vec<Segment> {
        let mut path = self.path.to_vec();
        path.push(segment);
        path
    }
}

impl<'de> DeserializeSeed<'de> for JsonSeed<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for JsonSeed<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        loop {
            let path = self.at(Segment::Index(items.len()));
            let seed = JsonSeed {
                path: &path,
                duplicates: self.duplicates,
            };
            match seq.next_element_seed(seed)? {
                Some(item) => items.push(item),
                None => return Ok(Value::Array(items)),
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let path = self.at(Segment::Key(key.clone()));
            let value = map.next_value_seed(JsonSeed {
                path: &path,
                duplicates: self.duplicates,
            })?;
            if object.contains_key(&key) {
                let mut duplicates = self.duplicates.borrow_mut();
                if !duplicates.contains(&path) {
                    duplicates.push(path);
                }
            } else {
                object.insert(key, value);
            }
        }
        Ok(Value::Object(object))
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

/// What is wrong with `instance`; `expected` is what its field takes, for a numeric field.
fn structure_message(
    kind: &ValidationErrorKind,
    instance: &Value,
    expected: Option<&str>,
) -> String {
    let found = match instance {
        Value::Null => "null".to_owned(),
        _ => format!("{} {}", json_kind(instance), compact(instance)),
    };
    // Messages of the schema's own words, unless the field says better what it takes.
    if let Some(expected) = expected {
        match kind {
            ValidationErrorKind::Type { .. } => {
                return format!("expected {expected}, found {found}");
            }
            ValidationErrorKind::Minimum { .. } | ValidationErrorKind::Maximum { .. } => {
                return format!("{} is out of range; expected {expected}", compact(instance));
            }
            _ => {}
        }
    }
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
            format!("expected {want}, found {found}")
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
