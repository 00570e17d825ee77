//! Semantic validation: names, match conditions, reachability, user settings.
//!
//! Every check appends to one list so an operator sees all problems in one answer.

use std::collections::HashMap;
use std::time::Duration;

use crate::size_grade::SizeGradeConfig;

use super::{PriorityTable, RuleMatch, TableError, MAX_RULES};

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
        errors.extend(
            size_errors
                .into_iter()
                .map(|e| TableError::new(format!("size_grade.{}", e.field), e.message)),
        );
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

fn check_path(p: &str) -> Result<(), &'static str> {
    if !p.starts_with('/') {
        return Err("must start with `/`");
    }
    if p.contains(['?', '#']) {
        return Err("must not contain a query or fragment (`?`, `#`); paths match without them");
    }
    if p.bytes().any(|b| b.is_ascii_whitespace() || b.is_ascii_control()) {
        return Err("must not contain whitespace or control characters");
    }
    Ok(())
}

/// A later rule is dead when an earlier one matches every request it matches.
fn check_reachability(table: &PriorityTable, errors: &mut Vec<TableError>) {
    for (j, later) in table.rules.iter().enumerate() {
        if later.matches.is_empty() {
            continue; // already reported as an empty match
        }
        let shadow = table.rules[..j].iter().enumerate().find(|(_, earlier)| {
            !earlier.matches.is_empty() && covers(&earlier.matches, &later.matches)
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

/// Whether every request matching `narrow` also matches `wide`.
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
    let headers = wide.header.iter().all(|(name, value)| {
        narrow.header.iter().any(|(n, v)| n.eq_ignore_ascii_case(name) && v == value)
    });
    method && path && host && headers
}

fn check_user(table: &PriorityTable, errors: &mut Vec<TableError>) {
    let header = &table.user.header;
    if header.is_empty() {
        errors.push(TableError::new("user.header", "must name the header carrying the user id"));
    } else if !is_token(header) {
        errors
            .push(TableError::new("user.header", format!("`{header}` is not a valid header name")));
    }
    if table.user.rekey_every < Duration::from_secs(1) {
        errors.push(TableError::new(
            "user.rekey_every",
            "must be at least 1s (the re-key period counts whole seconds)",
        ));
    }
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
