//! JSON Schemas for every event type and for the workload spec, generated from the Rust types.
//!
//! The committed copies live in `schemas/events/<type>.json` and `schemas/workload.v1.json`.
//! They are the contract other languages code against, so a test regenerates them and fails
//! when the committed files are stale; `allot schemas` (or
//! `ALLOT_UPDATE_SCHEMAS=1 cargo test -p allot-events`) rewrites them.

use std::path::Path;

use serde_json::Value;

use crate::{
    AccessEvent, AllocEvent, CostEvent, InventoryEvent, NodeEvent, RemediationEvent, TaskEvent,
    TelemetryEvent, WorkloadEvent,
};

/// The folder, relative to the workspace root, that holds the committed event schemas.
pub const DIR: &str = "schemas/events";

/// Every event type's schema as `(type, schema)`, sorted by type.
///
/// Each schema describes the whole CloudEvent: the envelope with `type` pinned to one value
/// and `data` to that event's payload.
pub fn all() -> Vec<(String, Value)> {
    let mut out: Vec<(String, Value)> = NodeEvent::data_schemas()
        .into_iter()
        .chain(TelemetryEvent::data_schemas())
        .chain(InventoryEvent::data_schemas())
        .chain(WorkloadEvent::data_schemas())
        .chain(TaskEvent::data_schemas())
        .chain(AllocEvent::data_schemas())
        .chain(CostEvent::data_schemas())
        .chain(RemediationEvent::data_schemas())
        .chain(AccessEvent::data_schemas())
        .map(|(ty, schema)| {
            let mut value = schema.to_value();
            pin_type(&mut value, &ty);
            (ty, value)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The committed schema of the workload spec (`apiVersion: allot/v1`, `kind: Workload`),
/// relative to the workspace root.
pub const WORKLOAD_SPEC_FILE: &str = "schemas/workload.v1.json";

/// The JSON Schema of a workload document, as users write it (YAML or JSON).
pub fn workload_spec() -> Value {
    let schema = schemars::generate::SchemaSettings::draft2020_12()
        .into_generator()
        .into_root_schema_for::<crate::workload::Workload>();
    let mut value = schema.to_value();
    not_nullable(&mut value);
    if let Some(obj) = value.as_object_mut() {
        obj.insert(
            "title".into(),
            Value::String("Allot Workload (allot/v1)".into()),
        );
    }
    value
}

/// Optional fields of the spec are left out, never written as `null`: drops the `null`
/// alternative schemars adds for every `Option`, so the schema says what users should write
/// and an error inside an optional object is reported there, not as an `anyOf` failure.
fn not_nullable(schema: &mut Value) {
    match schema {
        Value::Object(obj) => {
            if let Some(Value::Array(types)) = obj.get_mut("type") {
                types.retain(|t| t != "null");
                if types.len() == 1 {
                    let only = types.remove(0);
                    obj.insert("type".into(), only);
                }
            }
            if let Some(Value::Array(alternatives)) = obj.get("anyOf") {
                let rest: Vec<Value> = alternatives
                    .iter()
                    .filter(|a| a.get("type").is_none_or(|t| t != "null"))
                    .cloned()
                    .collect();
                if let [only] = rest.as_slice()
                    && let Some(only) = only.as_object()
                {
                    let only = only.clone();
                    obj.remove("anyOf");
                    for (k, v) in only {
                        obj.entry(k).or_insert(v);
                    }
                }
            }
            obj.values_mut().for_each(not_nullable);
        }
        Value::Array(items) => items.iter_mut().for_each(not_nullable),
        _ => {}
    }
}

/// The file name a type's schema is committed under.
pub fn file_name(ty: &str) -> String {
    format!("{ty}.json")
}

/// A schema as it is committed: pretty JSON and a final newline.
pub fn render(schema: &Value) -> String {
    let mut text = serde_json::to_string_pretty(schema).expect("a JSON value serializes");
    text.push('\n');
    text
}

/// Writes every schema into `dir`, removing schema files of types that no longer exist.
pub fn write_all(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let schemas = all();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name.ends_with(".json") && !schemas.iter().any(|(ty, _)| file_name(ty) == name) {
            std::fs::remove_file(&path)?;
        }
    }
    for (ty, schema) in &schemas {
        std::fs::write(dir.join(file_name(ty)), render(schema))?;
    }
    Ok(())
}

/// Pins the envelope's `type` to the one value this schema is for, and titles the schema.
fn pin_type(schema: &mut Value, ty: &str) {
    if let Some(obj) = schema.as_object_mut() {
        obj.insert("title".into(), Value::String(ty.to_owned()));
        if let Some(Value::Object(props)) = obj.get_mut("properties") {
            props.insert(
                "type".into(),
                serde_json::json!({ "const": ty, "description": "CloudEvents type." }),
            );
            props.insert(
                "specversion".into(),
                serde_json::json!({ "const": "1.0", "description": "CloudEvents spec version." }),
            );
        }
    }
}
