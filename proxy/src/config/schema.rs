//! The config file's JSON Schema, generated from the config types (`schemars` derives), and
//! the chart's `config` schema made from it: one list of fields, not two.
//!
//! `weir config schema` prints the file's schema (for editors and CI checks of config
//! files); `weir config schema --chart` prints what `charts/weir/values.schema.json` holds
//! under `properties.config`. The test below fails when the checked-in chart schema and the
//! types disagree; `WEIR_UPDATE_SCHEMA=1 cargo test -p proxy --lib config::schema` rewrites
//! that one block of the file and leaves the rest as it is.

use serde_json::{json, Map, Value};

use super::SidecarConfig;

/// Settings the chart fills in itself, from where it mounts the Secrets, the table and the
/// state volume (`weir.configYaml`). Values may not set them: a value the chart would
/// silently replace is worse than one refused with "additional properties not allowed".
pub const CHART_OWNED: &[&str] =
    &["admin.token_file", "admin.user_secret_file", "admin.table_file", "admin.state_path"];

/// Fields the chart's templates read (ports, probes, Service ports): values must keep them.
const CHART_REQUIRED: &[(&str, &[&str])] = &[
    ("", &["inbound", "admission", "admin"]),
    ("inbound", &["listen", "app"]),
    ("admin", &["listen", "public_listen"]),
];

/// The schema of the file `weir run --config` reads (draft 7, no `$ref`s, no defaults).
pub fn json_schema() -> Value {
    let schema = admission_core::schema::generator().into_root_schema_for::<SidecarConfig>();
    let mut value = schema.to_value();
    if let Some(object) = value.as_object_mut() {
        object.insert("title".into(), json!("weir sidecar configuration"));
        object.insert(
            "description".into(),
            json!(
                "The file `weir run --config` reads; every field is optional \
                   (`weir config print-default` shows the defaults)."
            ),
        );
    }
    value
}

/// The same file as the chart's `config` value: the chart-owned paths removed, the
/// listeners its templates read required (the public listener may not be null: the probes
/// and the monitors use it).
pub fn chart_config_schema() -> Value {
    let mut schema = json_schema();
    for path in CHART_OWNED {
        let (section, field) = path.split_once('.').unwrap_or(("", path));
        if let Some(props) = properties_mut(&mut schema, section) {
            props.remove(field);
        }
    }
    if let Some(props) = properties_mut(&mut schema, "admin") {
        props.insert(
            "public_listen".into(),
            json!({
                "description": "The listener serving only /metrics, /live and /ready: the \
                                probes and the monitors use it, so the chart requires it.",
                "type": "string",
                "pattern": admission_core::schema::SOCKET_ADDR_PATTERN,
            }),
        );
    }
    for (section, required) in CHART_REQUIRED {
        if let Some(object) = section_mut(&mut schema, section) {
            object.insert("required".into(), json!(required));
        }
    }
    if let Some(object) = schema.as_object_mut() {
        object.insert(
            "title".into(),
            json!("weir sidecar configuration (generated: weir config schema --chart)"),
        );
        object.insert(
            "description".into(),
            json!(format!(
                "Written verbatim as the sidecar's config file; snake_case keys exactly as \
                 `weir run` reads them. The chart sets {} from its mounts.",
                CHART_OWNED.join(", ")
            )),
        );
    }
    schema
}

fn section_mut<'a>(schema: &'a mut Value, section: &str) -> Option<&'a mut Map<String, Value>> {
    if section.is_empty() {
        return schema.as_object_mut();
    }
    schema.pointer_mut(&format!("/properties/{section}"))?.as_object_mut()
}

fn properties_mut<'a>(schema: &'a mut Value, section: &str) -> Option<&'a mut Map<String, Value>> {
    section_mut(schema, section)?.get_mut("properties")?.as_object_mut()
}

/// Every leaf field path of `schema` (`inbound.h2.max_concurrent_streams`, ...): an object
/// with `properties` is a section, anything else a field.
pub fn field_paths(schema: &Value) -> Vec<String> {
    fn walk(schema: &Value, prefix: &str, out: &mut Vec<String>) {
        match schema.get("properties").and_then(Value::as_object) {
            Some(props) => {
                for (name, sub) in props {
                    let path =
                        if prefix.is_empty() { name.clone() } else { format!("{prefix}.{name}") };
                    walk(sub, &path, out);
                }
            }
            None => out.push(prefix.to_string()),
        }
    }
    let mut out = Vec::new();
    walk(schema, "", &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn chart_schema_file() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../charts/weir/values.schema.json")
    }

    /// The byte range of the value of `"config"` among the top-level properties (the line
    /// `    "config": {` in the file's four-space nesting) up to its matching brace.
    fn config_block(text: &str) -> (usize, usize) {
        let key = "\n    \"config\": ";
        let start =
            text.find(key).expect("values.schema.json has no properties.config") + key.len();
        let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
        for (i, c) in text[start..].char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' if in_string => escaped = true,
                '"' => in_string = !in_string,
                '{' if !in_string => depth += 1,
                '}' if !in_string => {
                    depth -= 1;
                    if depth == 0 {
                        return (start, start + i + 1);
                    }
                }
                _ => {}
            }
        }
        panic!("properties.config in values.schema.json is not closed");
    }

    /// The drift check: the chart's `config` schema is exactly what the config types
    /// generate. `WEIR_UPDATE_SCHEMA=1` rewrites the block instead of failing.
    #[test]
    fn the_charts_config_schema_is_generated_from_the_config_types() {
        let path = chart_schema_file();
        let text = std::fs::read_to_string(&path).unwrap();
        let file: Value = serde_json::from_str(&text).unwrap();
        let want = chart_config_schema();
        if file.pointer("/properties/config") == Some(&want) {
            return;
        }
        if std::env::var_os("WEIR_UPDATE_SCHEMA").is_some() {
            let (start, end) = config_block(&text);
            let pretty = serde_json::to_string_pretty(&want).unwrap().replace('\n', "\n    ");
            let updated = format!("{}{}{}", &text[..start], pretty, &text[end..]);
            let check: Value = serde_json::from_str(&updated).unwrap();
            assert_eq!(check.pointer("/properties/config"), Some(&want));
            std::fs::write(&path, updated).unwrap();
            return;
        }
        panic!(
            "charts/weir/values.schema.json `config` differs from the config types; \
             regenerate it: WEIR_UPDATE_SCHEMA=1 cargo test -p proxy --lib config::schema"
        );
    }

    #[test]
    fn every_field_of_the_config_types_is_in_the_schema() {
        // Field names the schema lists against the Debug rendering of the default config,
        // which names every field of every struct: one list cannot lose a field the other has.
        let paths = field_paths(&json_schema());
        let debug = format!("{:#?}", SidecarConfig::default());
        let debug_fields: std::collections::BTreeSet<&str> = debug
            .lines()
            .filter_map(|l| l.trim().split_once(": ").map(|(k, _)| k))
            .filter(|k| k.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
            .collect();
        let schema_fields: std::collections::BTreeSet<&str> =
            paths.iter().flat_map(|p| p.split('.')).collect();
        let missing: Vec<_> = debug_fields.difference(&schema_fields).collect();
        assert!(missing.is_empty(), "config fields the schema lacks: {missing:?}");
        assert!(paths.contains(&"inbound.timeouts.app_connect".to_string()), "{paths:?}");
        assert!(paths.contains(&"egress.routes".to_string()), "{paths:?}");
    }

    /// The embedded default names every field, so `weir config print-default` is the whole
    /// reference (a field added to the types without a default line fails here).
    #[test]
    fn the_embedded_default_sets_every_field() {
        let doc: Value = serde_yaml::from_str(super::super::EMBEDDED_DEFAULT).unwrap();
        let missing: Vec<String> = field_paths(&json_schema())
            .into_iter()
            .filter(|p| doc.pointer(&format!("/{}", p.replace('.', "/"))).is_none())
            .collect();
        assert!(missing.is_empty(), "fields config/default.yaml leaves out: {missing:?}");
    }

    #[test]
    fn the_chart_schema_leaves_out_what_the_chart_mounts() {
        let chart = field_paths(&chart_config_schema());
        for owned in CHART_OWNED {
            assert!(!chart.iter().any(|p| p == owned), "{owned}");
        }
        let all = field_paths(&json_schema());
        assert_eq!(chart.len() + CHART_OWNED.len(), all.len());
    }
}
