//! Semantic validation: names, match conditions, reachability, user settings.
//!
//! Every check appends to one list so an operator sees all problems in one answer.

use std::collections::HashMap;
use std::time::Duration;

use crate::size_grade::SizeGradeConfig;
use crate::user_hash::MAX_CYCLE_PERIODS;

use super::{normalize_path, PriorityTable, RuleMatch, TableError, MAX_RULES};

pub(super) fn validate(table: &PriorityTable) -> Vec<TableError> {
    let mut errors = Vec::new();
    if table.rules.len() > MAX_RULES {
        errors.push(TableError::new(
            "rules",
            format!("{} rules; at most {MAX_RULES} are allowed", table.rules.len()),
        ));
        return errors;
    }
    let mut names: HashMap<&str, usize> = HashMap::new();
    for (i, rule) in table.rules.iter().enumerate() {
        let at = format!("rules[{i}]");
        if rule.name.trim().is_empty() {
            errors.push(TableError::new(format!("{at}.name"), "missing or empty rule name"));
        } else if rule.name.chars().any(|c| c.is_control() || matches!(c, '\u{2028}' | '\u{2029}'))
        {
            // One line of text: names go into logs, audits and metrics, and a line break
            // would make the persisted YAML a block scalar.
            errors.push(TableError::new(
                format!("{at}.name"),
                "rule name contains a line break or control character",
            ));
        } else if let Some(first) = names.insert(&rule.name, i) {
            names.insert(&rule.name, first);
            errors.push(TableError::new(
                format!("{at}.name"),
                format!("duplicate rule name `{}` (first used by rules[{first}])", rule.name),
            ));
        }
        check_match(&rule.matches, &format!("{at}.match"), &mut errors);
    }
    check_reachability(table, &mut errors);
    check_user(table, &mut errors);
    if let Some(Err(size_errors)) = table.size_grade.as_ref().map(SizeGradeConfig::validate) {
        errors.extend(size_errors.into_iter().map(|e| e.at("size_grade")));
    }
    errors
}

fn check_match(m: &RuleMatch, at: &str, errors: &mut Vec<TableError>) {
    if m.is_empty() {
        errors.push(TableError::new(
            at,
            "empty match would match every request; set at least one of method, path, \
             path_prefix, host, header (or use default_business)",
        ));
        return;
    }
    if let Some(method) = &m.method {
        if !is_token(method) {
            errors.push(TableError::new(
                format!("{at}.method"),
                format!("`{method}` is not a valid HTTP method"),
            ));
        } else if method.bytes().any(|b| b.is_ascii_lowercase()) {
            errors.push(TableError::new(
                format!("{at}.method"),
                format!(
                    "`{method}` is not upper case; methods are case-sensitive (did you mean `{}`?)",
                    method.to_ascii_uppercase()
                ),
            ));
        }
    }
    if m.path.is_some() && m.path_prefix.is_some() {
        errors.push(TableError::new(
            format!("{at}.path_prefix"),
            "set either path or path_prefix, not both",
        ));
    }
    for (field, value) in [("path", &m.path), ("path_prefix", &m.path_prefix)] {
        if let Some(p) = value {
            if let Err(why) = check_path(p) {
                errors.push(TableError::new(format!("{at}.{field}"), format!("`{p}` {why}")));
            }
        }
    }
    if let Some(host) = &m.host {
        let ok = !host.is_empty()
            && host.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._:[]".contains(&b));
        if !ok {
            errors.push(TableError::new(
                format!("{at}.host"),
                format!("`{host}` is not a valid host"),
            ));
        }
    }
    let mut seen: HashMap<String, &str> = HashMap::new();
    for (name, value) in &m.header {
        let path = format!("{at}.header.{name}");
        if !is_token(name) {
            errors.push(TableError::new(&path, format!("`{name}` is not a valid header name")));
        } else if let Some(other) = seen.insert(name.to_ascii_lowercase(), name) {
            errors.push(TableError::new(
                &path,
                format!("header names are case-insensitive; `{name}` repeats `{other}`"),
            ));
        }
        if value.bytes().any(|b| b.is_ascii_control() && b != b'\t') {
            errors.push(TableError::new(&path, "header value contains control characters"));
        }
    }
}

fn check_path(p: &str) -> Result<(), String> {
    if !p.starts_with('/') {
        return Err("must start with `/`".into());
    }
    if p.contains(['?', '#']) {
        return Err(
            "must not contain a query or fragment (`?`, `#`); paths match without them".into()
        );
    }
    if p.bytes().any(|b| b.is_ascii_whitespace() || b.is_ascii_control()) {
        return Err("must not contain whitespace or control characters".into());
    }
    // The entry classifies the normalised path, so a rule written any other way could
    // never match (docs/design.md, "Priority table").
    match normalize_path(p) {
        Ok(n) if n == p => Ok(()),
        Ok(n) => Err(format!("is not a normalised path; requests are matched as `{n}`")),
        Err(e) => Err(format!("can never match: {e}")),
    }
}

/// A later rule is dead when an earlier one matches every request it matches.
///
/// Pairwise over rules, but header conditions are compared as sorted lists of interned
/// `(name, value)` ids, so a pair costs at most one pass over both lists (never headers x
/// headers), and a pair whose earlier rule has more headers than the later one is skipped.
fn check_reachability(table: &PriorityTable, errors: &mut Vec<TableError>) {
    let mut ids: HashMap<(String, &str), u32> = HashMap::new();
    let headers: Vec<Vec<u32>> = table
        .rules
        .iter()
        .map(|r| {
            let mut list: Vec<u32> = r
                .matches
                .header
                .iter()
                .map(|(n, v)| {
                    let next = ids.len() as u32;
                    *ids.entry((n.to_ascii_lowercase(), v.as_str())).or_insert(next)
                })
                .collect();
            list.sort_unstable();
            list
        })
        .collect();
    for (j, later) in table.rules.iter().enumerate() {
        if later.matches.is_empty() {
            continue; // already reported as an empty match
        }
        let shadow = table.rules[..j].iter().enumerate().find(|(i, earlier)| {
            !earlier.matches.is_empty()
                && covers(&earlier.matches, &later.matches)
                && is_sorted_subset(&headers[*i], &headers[j])
        });
        if let Some((i, earlier)) = shadow {
            errors.push(TableError::new(
                format!("rules[{j}].match"),
                format!(
                    "rule `{}` is unreachable: rules[{i}] (`{}`) matches every request it \
                     matches, and the first match wins; move it above rules[{i}] or narrow rules[{i}]",
                    later.name, earlier.name
                ),
            ));
        }
    }
}

/// Whether every element of `small` is in `big`; both sorted ascending.
fn is_sorted_subset(small: &[u32], big: &[u32]) -> bool {
    if small.len() > big.len() {
        return false;
    }
    let mut rest = big.iter();
    small.iter().all(|s| rest.by_ref().find(|b| *b >= s) == Some(s))
}

/// Whether every request matching `narrow` also matches `wide`, headers aside (the caller
/// compares those with an index).
fn covers(wide: &RuleMatch, narrow: &RuleMatch) -> bool {
    let method = match (&wide.method, &narrow.method) {
        (None, _) => true,
        (Some(w), Some(n)) => w == n,
        (Some(_), None) => false,
    };
    let path = match (&wide.path, &wide.path_prefix) {
        (Some(w), _) => narrow.path.as_ref() == Some(w),
        (None, Some(prefix)) => narrow
            .path
            .as_ref()
            .or(narrow.path_prefix.as_ref())
            .is_some_and(|n| n.starts_with(prefix.as_str())),
        (None, None) => true,
    };
    let host = match (&wide.host, &narrow.host) {
        (None, _) => true,
        // A host without a port matches that host on any port.
        (Some(w), Some(n)) => {
            w.eq_ignore_ascii_case(n) || (!has_port(w) && strip_port(n).eq_ignore_ascii_case(w))
        }
        (Some(_), None) => false,
    };
    method && path && host
}

fn check_user(table: &PriorityTable, errors: &mut Vec<TableError>) {
    let header = &table.user.header;
    if header.is_empty() {
        errors.push(TableError::new("user.header", "must name the header carrying the user id"));
    } else if !is_token(header) {
        errors
            .push(TableError::new("user.header", format!("`{header}` is not a valid header name")));
    } else if let Err(why) = check_reserved_header(&header.to_ascii_lowercase()) {
        errors.push(TableError::new("user.header", why));
    }
    if table.user.rekey_every < Duration::from_secs(1) {
        errors.push(TableError::new(
            "user.rekey_every",
            "must be at least 1s (the re-key period counts whole seconds)",
        ));
    }
    let n = table.user.cycle_periods;
    if !(1..=MAX_CYCLE_PERIODS).contains(&n) {
        errors.push(TableError::new(
            "user.cycle_periods",
            format!("{n} is out of range 1..={MAX_CYCLE_PERIODS} (periods per balanced cycle)"),
        ));
    }
}

/// Header names weir must never set, remove or rename: message framing (a priority stamped
/// into `content-length` would corrupt every message), connection management (hop-by-hop,
/// RFC 9110 section 7.6.1), routing (`host`), credentials, and the gRPC status headers its
/// refusals write.
pub const RESERVED_HEADERS: &[&str] = &[
    "connection",
    "content-length",
    "content-type",
    "content-encoding",
    "host",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "http2-settings",
    "authorization",
    "cookie",
    "set-cookie",
    "expect",
    "date",
    "retry-after",
    "grpc-status",
    "grpc-message",
    "grpc-timeout",
    "grpc-encoding",
    "grpc-accept-encoding",
    "grpc-retry-pushback-ms",
];

/// Why a lower-case header name cannot be one weir is configured to set or strip.
pub fn check_reserved_header(name: &str) -> Result<(), String> {
    if name.starts_with(':') {
        return Err(format!("`{name}` is an HTTP/2 pseudo-header"));
    }
    if RESERVED_HEADERS.contains(&name) || name.starts_with("proxy-") {
        return Err(format!(
            "`{name}` is reserved (framing, hop-by-hop, routing, credentials or gRPC status); \
             choose an `x-` name"
        ));
    }
    Ok(())
}

/// RFC 9110 `token`: the syntax of methods and header names.
pub(super) fn is_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

pub(super) fn has_port(host: &str) -> bool {
    strip_port(host).len() != host.len()
}

/// `example.com:8080` -> `example.com`, `[::1]:80` -> `[::1]`; unchanged without a port.
pub(super) fn strip_port(host: &str) -> &str {
    match host.rfind(':') {
        Some(i)
            if host[i + 1..].bytes().all(|b| b.is_ascii_digit()) && !host[..i].contains(':') =>
        {
            &host[..i]
        }
        Some(i) if host.starts_with('[') && host[..i].ends_with(']') => &host[..i],
        _ => host,
    }
}
