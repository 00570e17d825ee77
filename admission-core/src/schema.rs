//! JSON Schema pieces for the config file's value types that serde reads from strings.
//!
//! The config structs derive `schemars::JsonSchema`; a field deserialised through
//! `humantime_serde` or parsed as a socket address names one of these types in
//! `#[schemars(with = "...")]`, so its schema says what the file really holds (a string of
//! a given shape), not the Rust type's layout. Each pattern accepts only strings weir
//! parses (property-tested below), so a value the chart's schema lets through is never
//! refused by the parser; the ranges the validation adds (`task_timeout` > 0, at most 1h,
//! ...) stay with `weir config check`.

use std::borrow::Cow;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};

/// A humantime duration as the config file spells it: `500ms`, `1s`, `1m 30s`. Units: `ns`,
/// `us`, `ms`, `s`, `m`, `h`, `d`; up to nine digits per item (no overflow). Fractions
/// (`1.5s`) are left out: humantime refuses some (`0.1ns`), so write `1500ms`.
pub const DURATION_PATTERN: &str =
    r"^[0-9]{1,9}(ns|us|ms|s|m|h|d)( ?[0-9]{1,9}(ns|us|ms|s|m|h|d))*$";

/// An IP socket address: `a.b.c.d:port` (each part in range, no leading zeros) or
/// `[v6]:port`. A host name is not an address: weir binds and connects without resolving.
pub const SOCKET_ADDR_PATTERN: &str = concat!(
    r"^(((25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])",
    r"|\[[0-9a-fA-F:.]+\])",
    r":(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3}|0)$"
);

/// Schema stand-in for a `Duration` read with `humantime_serde`.
pub struct HumanDuration;

impl JsonSchema for HumanDuration {
    fn schema_name() -> Cow<'static, str> {
        "HumanDuration".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": "string", "pattern": DURATION_PATTERN })
    }
}

/// Schema stand-in for a `SocketAddr`.
pub struct SocketAddrString;

impl JsonSchema for SocketAddrString {
    fn schema_name() -> Cow<'static, str> {
        "SocketAddr".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": "string", "pattern": SOCKET_ADDR_PATTERN })
    }
}

/// The generator every config schema is made with: JSON Schema draft 7 (what Helm's
/// values.schema.json validator reads everywhere), every subschema inlined (no `$ref`s, so
/// the schema can be pasted under a chart's `config` key), and then [`plain`].
pub fn generator() -> SchemaGenerator {
    let mut settings = schemars::generate::SchemaSettings::draft07();
    settings.inline_subschemas = true;
    settings.meta_schema = None;
    settings.transforms.push(Box::new(plain));
    settings.into_generator()
}

/// Rewrites a generated schema into the plain form validators explain best:
/// - no `default`s: the defaults live in one place, the `Default` impls (`weir config
///   print-default`), and several config types are not `Serialize`, so a schema with some
///   defaults would be half a list;
/// - no `format`s: `uint`/`double` are schemars' own names, which validators ignore;
/// - a `oneOf` of string constants (a documented enum) becomes `enum`, the variants'
///   descriptions folded into one, so a wrong value reads "must be one of ...".
pub fn plain(schema: &mut Schema) {
    if let Some(object) = schema.as_object_mut() {
        object.remove("default");
        object.remove("format");
        let constants: Option<Vec<(serde_json::Value, Option<String>)>> =
            object.get("oneOf").and_then(|v| v.as_array()).and_then(|variants| {
                variants
                    .iter()
                    .map(|v| {
                        let c = v.get("const")?.clone();
                        c.is_string().then_some(())?;
                        let doc = v.get("description").and_then(|d| d.as_str()).map(String::from);
                        Some((c, doc))
                    })
                    .collect()
            });
        if let Some(constants) = constants {
            object.remove("oneOf");
            let mut doc: Vec<String> = object
                .get("description")
                .and_then(|d| d.as_str())
                .map(String::from)
                .into_iter()
                .collect();
            for (c, d) in &constants {
                if let (Some(c), Some(d)) = (c.as_str(), d) {
                    doc.push(format!("`{c}`: {d}"));
                }
            }
            object.insert("type".into(), "string".into());
            object.insert("enum".into(), constants.into_iter().map(|(c, _)| c).collect());
            if !doc.is_empty() {
                object.insert("description".into(), doc.join("\n").into());
            }
        }
    }
    schemars::transform::transform_subschemas(&mut plain, schema);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::net::SocketAddr;

    fn matches(pattern: &str) -> proptest::string::RegexGeneratorStrategy<String> {
        // The anchors are JSON Schema's way to say "whole string"; the generator wants none.
        let body = pattern.trim_start_matches('^').trim_end_matches('$');
        proptest::string::string_regex(body).unwrap()
    }

    proptest! {
        /// What the chart's schema lets through, weir's config parser accepts.
        #[test]
        fn every_duration_the_pattern_accepts_parses(s in matches(DURATION_PATTERN)) {
            prop_assert!(humantime_serde::re::humantime::parse_duration(&s).is_ok(), "{s:?}");
        }

        #[test]
        fn every_ipv4_address_the_pattern_accepts_parses(s in matches(SOCKET_ADDR_PATTERN)) {
            if !s.starts_with('[') {
                prop_assert!(s.parse::<SocketAddr>().is_ok(), "{s:?}");
            }
        }
    }

    #[test]
    fn the_patterns_take_the_usual_spellings_and_refuse_the_rest() {
        let duration = regex_lite(DURATION_PATTERN);
        for ok in ["500ms", "1s", "0s", "1m 30s", "1h30m", "2d", "100us", "10ns"] {
            assert!(duration(ok), "{ok}");
        }
        for bad in ["", "soon", "1", "1 s", "-1s", "1sec", "1.5s", " 1s", "1s "] {
            assert!(!duration(bad), "{bad}");
        }
        let addr = regex_lite(SOCKET_ADDR_PATTERN);
        for ok in ["0.0.0.0:15001", "127.0.0.1:0", "[::1]:8080", "255.255.255.255:65535"] {
            assert!(addr(ok), "{ok}");
        }
        for bad in ["localhost:80", "256.0.0.1:1", "1.2.3:4", "1.2.3.4:65536", "1.2.3.4", ":80"] {
            assert!(!addr(bad), "{bad}");
        }
    }

    /// A whole-string match (the patterns carry their anchors).
    fn regex_lite(pattern: &str) -> impl Fn(&str) -> bool {
        let re = regex::Regex::new(pattern).unwrap();
        move |s| re.is_match(s)
    }
}
