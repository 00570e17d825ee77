use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;

use super::*;

/// A request for the classifier tests.
#[derive(Debug, Clone, Default)]
struct Req {
    method: String,
    path: String,
    host: Option<String>,
    headers: Vec<(String, Vec<u8>)>,
}

impl Req {
    fn new(method: &str, path: &str) -> Self {
        Req { method: method.into(), path: path.into(), ..Req::default() }
    }

    fn host(mut self, host: &str) -> Self {
        self.host = Some(host.into());
        self
    }

    fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.as_bytes().to_vec()));
        self
    }
}

impl RequestView for Req {
    fn method(&self) -> &str {
        &self.method
    }
    fn path(&self) -> &str {
        &self.path
    }
    fn host(&self) -> Option<&str> {
        self.host.as_deref()
    }
    fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| &v[..])
    }
}

fn errors_of(yaml: &str) -> Vec<TableError> {
    match PriorityTable::from_yaml(yaml) {
        Ok(t) => panic!("expected errors, parsed {t:?}"),
        Err(e) => e.0,
    }
}

fn paths(errors: &[TableError]) -> Vec<&str> {
    errors.iter().map(|e| e.path.as_str()).collect()
}

#[test]
fn embedded_default_parses_and_compiles() {
    let table = PriorityTable::from_yaml(EMBEDDED_DEFAULT_YAML).expect("embedded table parses");
    let compiled = table.compile().expect("embedded table compiles");
    assert_eq!(compiled.version(), 1);
    assert_eq!(compiled.least_important_business(), 200);
    assert_eq!(PriorityTable::embedded_default(), table);
    assert_eq!(table.user.rekey_every, Duration::from_secs(3600));
    assert_eq!(table.user.schedule, UserSchedule::Balanced);
    assert_eq!(table.user.cycle_periods, 24);
    assert_eq!(
        compiled.user_hasher().schedule(),
        crate::user_hash::RekeySchedule::Balanced { cycle_periods: 24 }
    );
}

#[test]
fn user_schedule_is_read_and_validated_with_its_path() {
    let t = PriorityTable::from_yaml(
        "user: { schedule: independent, cycle_periods: 7 }
",
    )
    .unwrap();
    assert_eq!(t.user.schedule, UserSchedule::Independent);
    assert_eq!(
        t.compile().unwrap().user_hasher().schedule(),
        crate::user_hash::RekeySchedule::Independent
    );
    let t = PriorityTable::from_yaml(
        "user: { cycle_periods: 1024 }
",
    )
    .unwrap();
    assert_eq!(t.user.schedule, UserSchedule::Balanced, "balanced unless told otherwise");
    for (yaml, path) in [
        (
            "user: { schedule: random }
",
            "user.schedule",
        ),
        (
            "user: { cycle_periods: 0 }
",
            "user.cycle_periods",
        ),
        (
            "user: { cycle_periods: 1025 }
",
            "user.cycle_periods",
        ),
        (
            "user: { cycle_periods: -3 }
",
            "user.cycle_periods",
        ),
        (
            "user: { cycle_periods: 99999999999 }
",
            "user.cycle_periods",
        ),
    ] {
        let e = errors_of(yaml);
        assert_eq!(paths(&e), [path], "{yaml}: {e:#?}");
    }
    // Both at once, with the other user fields: every problem in one answer.
    let e = errors_of(
        "user: { header: '', schedule: x, cycle_periods: 0 }
",
    );
    assert_eq!(paths(&e).len(), 3, "{e:#?}");
    // A table built in code is validated the same way.
    let mut table = PriorityTable::empty();
    table.user.cycle_periods = 5000;
    assert_eq!(paths(&table.validate()), ["user.cycle_periods"]);
}

#[test]
fn design_example_classifies() {
    let t = PriorityTable::embedded_default().compile().unwrap();
    let c = |r: &Req| t.classify(r);
    assert_eq!(c(&Req::new("POST", "/api/login")), Classification { business: 0, rule: Some(0) });
    assert_eq!(c(&Req::new("GET", "/api/login")).business, 200);
    assert_eq!(c(&Req::new("POST", "/api/login?next=/x")).business, 0, "query is ignored");
    assert_eq!(c(&Req::new("GET", "/api/pay/123")).business, 1);
    assert_eq!(c(&Req::new("GET", "/api/pay")).business, 200, "prefix is byte-exact");
    assert_eq!(c(&Req::new("GET", "/api/feed/x")).business, 200, "header missing");
    let bg = Req::new("GET", "/api/feed/x").header("X-Client-Kind", "background");
    assert_eq!(c(&bg), Classification { business: 40, rule: Some(2) });
    let fg = Req::new("GET", "/api/feed/x").header("x-client-kind", "foreground");
    assert_eq!(c(&fg).business, 200);
    assert!(t.produces(0) && t.produces(1) && t.produces(40) && t.produces(200));
    assert!(!t.produces(2) && !t.produces(255));
    assert_eq!(t.user_header(), "x-user-id");
    assert_eq!(t.rule_name(2), Some("feed-refresh"));
}

#[test]
fn first_match_wins_across_exact_index_and_general_rules() {
    let yaml = r#"
rules:
  - { name: by-host, match: { host: api.example.com }, business: 5 }
  - { name: exact, match: { path: /a }, business: 6 }
  - { name: get-only, match: { method: GET }, business: 7 }
  - { name: exact-post, match: { path: /b, method: POST }, business: 8 }
"#;
    let t = PriorityTable::from_yaml(yaml).unwrap().compile().unwrap();
    assert_eq!(t.classify(&Req::new("GET", "/a").host("API.example.com:8443")).business, 5);
    assert_eq!(t.classify(&Req::new("GET", "/a").host("other")).business, 6);
    assert_eq!(t.classify(&Req::new("GET", "/b")).business, 7);
    assert_eq!(t.classify(&Req::new("POST", "/b")).business, 8);
    assert_eq!(t.classify(&Req::new("PUT", "/c")), Classification { business: 200, rule: None });
    assert_eq!(t.least_important_business(), 200);
}

#[test]
fn indexed_exact_paths_keep_table_order() {
    // Enough exact-path rules to switch the path index on, interleaved with general rules.
    let mut yaml = String::from("rules:\n");
    for i in 0..20 {
        yaml.push_str(&format!(
            "  - {{ name: e{i}, match: {{ path: /p/{i}, method: GET }}, business: {i} }}\n"
        ));
        yaml.push_str(&format!(
            "  - {{ name: g{i}, match: {{ path_prefix: /p/{i}/, method: POST }}, business: {} }}\n",
            100 + i
        ));
    }
    yaml.push_str("  - { name: any-put, match: { method: PUT }, business: 99 }\n");
    yaml.push_str(
        "  - { name: late-exact, match: { path: /p/3, method: DELETE }, business: 98 }\n",
    );
    let table = PriorityTable::from_yaml(&yaml).unwrap();
    let compiled = table.compile().unwrap();
    for method in ["GET", "POST", "PUT", "DELETE"] {
        for i in 0..22 {
            let path = if method == "POST" { format!("/p/{i}/x") } else { format!("/p/{i}") };
            let req = Req::new(method, &path);
            let want = table.rules.iter().position(|r| naive_match(&r.matches, &req, &path));
            assert_eq!(compiled.classify(&req).rule, want, "{method} {path}");
        }
    }
    assert_eq!(compiled.classify(&Req::new("DELETE", "/p/3")).business, 98);
    assert_eq!(compiled.classify(&Req::new("PUT", "/p/3")).business, 99);
}

#[test]
fn host_with_port_matches_only_that_port() {
    let yaml = "rules:\n  - { name: h, match: { host: 'api:8080' }, business: 3 }\n";
    let t = PriorityTable::from_yaml(yaml).unwrap().compile().unwrap();
    assert_eq!(t.classify(&Req::new("GET", "/").host("api:8080")).business, 3);
    assert_eq!(t.classify(&Req::new("GET", "/").host("api:9090")).business, 200);
    assert_eq!(t.classify(&Req::new("GET", "/")).business, 200);
}

#[test]
fn json_and_yaml_round_trip() {
    let table = PriorityTable::embedded_default();
    let json = table.to_json_pretty();
    assert!(json.contains("\"rekey_every\": \"1h\""), "{json}");
    assert_eq!(PriorityTable::from_json(&json).unwrap(), table);
    let yaml = table.to_yaml();
    assert!(yaml.contains("rekey_every: 1h"), "{yaml}");
    assert!(yaml.contains("schedule: balanced") && yaml.contains("cycle_periods: 24"), "{yaml}");
    assert_eq!(PriorityTable::from_yaml(&yaml).unwrap(), table);
    // And through plain serde, as a field of some larger config.
    let via_serde: PriorityTable = serde_json::from_str(&json).unwrap();
    assert_eq!(via_serde, table);
}

#[test]
fn reports_every_error_with_its_path() {
    let yaml = r#"
default_business: 300
rules:
  - name: a
    match: { path: /a }
    business: 1
  - name: a
    match: { path: /b }
    business: -1
  - name: empty
    match: {}
    business: 2
  - name: ""
    match: { method: post, path: nope }
    business: 3
  - name: shadowed
    match: { path: /a, method: GET }
    business: 4
  - name: headers
    match: { header: { "bad name": x } }
    business: 5
user:
  header: ""
  rekey_every: 0s
"#;
    let errors = errors_of(yaml);
    let got = paths(&errors);
    for want in [
        "default_business",
        "rules[1].business",
        "rules[1].name",
        "rules[2].match",
        "rules[3].name",
        "rules[3].match.method",
        "rules[3].match.path",
        "rules[4].match",
        "rules[5].match.header.bad name",
        "user.header",
        "user.rekey_every",
    ] {
        assert!(got.contains(&want), "missing error at {want}; got {errors:#?}");
    }
    let shadow = errors.iter().find(|e| e.path == "rules[4].match").unwrap();
    assert!(shadow.message.contains("unreachable") && shadow.message.contains("rules[0]"));
    let dup = errors.iter().find(|e| e.path == "rules[1].name").unwrap();
    assert!(dup.message.contains("duplicate"), "{dup:?}");
}

#[test]
fn shadowing_rules() {
    let shadowed = |wide: &str, narrow: &str| {
        let yaml = format!(
            "rules:\n  - {{ name: w, match: {wide}, business: 1 }}\n  - {{ name: n, match: {narrow}, business: 2 }}\n"
        );
        match PriorityTable::from_yaml(&yaml) {
            Ok(_) => false,
            Err(e) => e.iter().any(|e| e.message.contains("unreachable")),
        }
    };
    assert!(shadowed("{ path_prefix: /api }", "{ path_prefix: /api/pay }"));
    assert!(shadowed("{ path_prefix: /api }", "{ path: /api/x, method: GET }"));
    assert!(shadowed("{ method: GET }", "{ method: GET, host: a }"));
    assert!(shadowed("{ host: a }", "{ host: 'A:80' }"));
    assert!(shadowed("{ header: { x-a: '1' } }", "{ header: { X-A: '1', x-b: '2' } }"));
    assert!(!shadowed("{ path_prefix: /api/pay }", "{ path_prefix: /api }"));
    assert!(!shadowed("{ method: GET }", "{ method: POST }"));
    assert!(!shadowed("{ method: GET }", "{ path: /x }"));
    assert!(!shadowed("{ host: 'a:80' }", "{ host: a }"));
    assert!(!shadowed("{ header: { x-a: '1' } }", "{ header: { x-a: '2' } }"));
}

#[test]
fn malformed_documents_name_the_field() {
    let e = errors_of("rules:\n  - name: a\n    match: { path: /a }\n    business: high\n");
    assert_eq!(e.len(), 1);
    assert_eq!(e[0].path, "rules[0].business", "{e:?}");
    assert!(e[0].message.contains("malformed YAML"), "{e:?}");

    let e = errors_of("rules:\n  - name: a\n    match: { paht: /a }\n    business: 1\n");
    assert_eq!(e[0].path, "rules[0].match.paht", "{e:?}");
    assert!(e[0].message.starts_with("malformed YAML: unknown field `paht`"), "{e:?}");

    let e = PriorityTable::from_json(
        r#"{"rules": [{"name": "a", "business": 1, "match": {"path": 5}}]}"#,
    )
    .unwrap_err()
    .0;
    assert_eq!(e[0].path, "rules[0].match.path", "{e:?}");
    assert!(e[0].message.contains("malformed JSON"), "{e:?}");

    let e = PriorityTable::from_json(r#"{"rules": []} trailing"#).unwrap_err().0;
    assert!(e[0].message.contains("malformed JSON"), "{e:?}");

    let e = errors_of("user: { rekey_every: soon }\n");
    assert_eq!(e[0].path, "user.rekey_every");
    assert!(e[0].message.contains("soon"));

    assert!(PriorityTable::from_yaml(": : :").is_err());
    assert!(PriorityTable::from_yaml("- a list").is_err());
}

#[test]
fn size_grade_is_validated_and_counted_as_produced() {
    let e = errors_of("size_grade: { min_bytes: 100 }\n");
    assert_eq!(paths(&e), ["size_grade.min_bytes"]);

    let yaml = "default_business: 50\nsize_grade: { business: 100, min_bytes: 64, max_bytes: 1024, sub_bits: 7 }\n";
    let t = PriorityTable::from_yaml(yaml).unwrap().compile().unwrap();
    let grade = t.size_grade().expect("size grade compiled");
    assert_eq!(grade.business_classes(), 100..=103);
    assert!((100..=103).all(|b| t.produces(b)) && !t.produces(104));
    assert_eq!(t.least_important_business(), 103);
}

#[test]
fn too_many_rules_is_one_clear_error() {
    let mut table = PriorityTable::empty();
    table.rules = (0..=MAX_RULES)
        .map(|i| Rule {
            name: format!("r{i}"),
            matches: RuleMatch { path: Some(format!("/p{i}")), ..RuleMatch::default() },
            business: 1,
        })
        .collect();
    let errors = table.compile().unwrap_err();
    assert_eq!(paths(&errors.0), ["rules"]);
}

#[test]
fn errors_display_as_one_line() {
    let e = PriorityTable::from_yaml("default_business: 256\nuser: { header: '' }\n").unwrap_err();
    let line = e.to_string();
    assert!(line.starts_with("invalid priority table (2 errors)"), "{line}");
    assert!(!line.contains('\n'));
}

#[test]
fn user_hasher_uses_the_secret_and_period() {
    let mut table = PriorityTable::embedded_default();
    table.user.rekey_every = Duration::from_secs(60);
    let a = table.compile_with_secret(b"one").unwrap();
    let b = table.compile_with_secret(b"two").unwrap();
    let next = a.compile_next(&table).unwrap();
    let t = Duration::from_secs(1_800_000_000);
    let users: Vec<String> = (0..64).map(|i| format!("user-{i}")).collect();
    let levels = |c: &CompiledTable| -> Vec<u8> {
        users.iter().map(|u| c.user_hasher().user_priority(u.as_bytes(), t)).collect()
    };
    assert_eq!(levels(&a), levels(&next), "compile_next keeps the secret");
    assert_ne!(levels(&a), levels(&b));
}

// --- property tests ---

fn arb_segment() -> impl Strategy<Value = String> {
    prop::sample::select(vec!["/", "/a", "/a/", "/a/b", "/b", "/api", "/api/pay", "/x?y"])
        .prop_map(str::to_owned)
}

fn arb_rule_match() -> impl Strategy<Value = RuleMatch> {
    (
        prop::option::of(prop::sample::select(vec!["GET", "POST", "PUT"])),
        prop::option::of(arb_segment()),
        any::<bool>(),
        prop::option::of(prop::sample::select(vec!["a", "b:80", "B"])),
        prop::option::of(prop::sample::select(vec!["x-a", "X-B"])),
    )
        .prop_map(|(method, path, prefix, host, header)| RuleMatch {
            method: method.map(str::to_owned),
            path: path.clone().filter(|_| !prefix).map(|p| p.replace('?', "")),
            path_prefix: path.filter(|_| prefix).map(|p| p.replace('?', "")),
            host: host.map(str::to_owned),
            header: header
                .into_iter()
                .map(|h| (h.to_owned(), "1".to_owned()))
                .collect::<BTreeMap<_, _>>(),
        })
}

fn arb_request() -> impl Strategy<Value = Req> {
    (
        ".{0,8}",
        prop_oneof![arb_segment(), ".{0,16}"],
        prop::option::of(prop_oneof![
            prop::sample::select(vec!["a", "A:80", "b:80", "b:81", "B", "c"])
                .prop_map(str::to_owned),
            "[^:]{0,12}",
        ]),
        prop::collection::vec(("[a-zA-Z-]{1,5}", prop::collection::vec(any::<u8>(), 0..4)), 0..3),
    )
        .prop_map(|(method, path, host, headers)| Req { method, path, host, headers })
}

proptest! {
    #[test]
    fn classify_never_panics_and_agrees_with_a_linear_scan(
        matches in prop::collection::vec(arb_rule_match(), 0..12),
        reqs in prop::collection::vec(arb_request(), 1..16),
    ) {
        let mut table = PriorityTable::empty();
        table.rules = matches
            .into_iter()
            .enumerate()
            .map(|(i, m)| Rule { name: format!("r{i}"), matches: m, business: i as u8 })
            .collect();
        // Random tables are often invalid (shadowed rules): drop failing rules until valid.
        while let Err(e) = table.compile() {
            let bad = e.0.iter().find_map(|e| {
                e.path.strip_prefix("rules[")?.split(']').next()?.parse::<usize>().ok()
            });
            match bad {
                Some(i) => { table.rules.remove(i); }
                None => prop_assert!(false, "unexpected errors {e}"),
            }
        }
        let compiled = table.compile().unwrap();
        for req in &reqs {
            let got = compiled.classify(req);
            let path = req.path.split('?').next().unwrap_or("");
            let want = table.rules.iter().position(|r| naive_match(&r.matches, req, path));
            prop_assert_eq!(got.rule, want);
            prop_assert!(compiled.produces(got.business));
            prop_assert!(got.business <= compiled.least_important_business());
        }
    }

    #[test]
    fn parsers_never_panic(text in ".{0,200}") {
        let _ = PriorityTable::from_yaml(&text);
        let _ = PriorityTable::from_json(&text);
    }
}

/// The obvious, slow definition the compiled matcher must agree with.
fn naive_match(m: &RuleMatch, req: &Req, path: &str) -> bool {
    m.method.as_ref().is_none_or(|x| *x == req.method)
        && m.path.as_ref().is_none_or(|x| x == path)
        && m.path_prefix.as_ref().is_none_or(|x| path.starts_with(x.as_str()))
        && m.host.as_ref().is_none_or(|h| {
            req.host.as_ref().is_some_and(|got| {
                let got =
                    if h.contains(':') { got.as_str() } else { got.split(':').next().unwrap() };
                got.eq_ignore_ascii_case(h)
            })
        })
        && m.header.iter().all(|(n, v)| req.header(&n.to_ascii_lowercase()) == Some(v.as_bytes()))
}

#[test]
fn hostile_nesting_is_refused_before_the_parser() {
    let started = std::time::Instant::now();
    for body in ["[".repeat(200_000), "{a: ".repeat(50_000), "- ".repeat(100_000)] {
        let e = PriorityTable::from_yaml(&body).unwrap_err();
        assert!(e.to_string().contains("nested more than"), "{e}");
        let e = PriorityTable::from_json(&body).unwrap_err();
        assert!(e.to_string().contains("malformed"), "{e}");
    }
    // Brackets in quoted scalars and comments are text, not nesting.
    let quoted = format!(
        "rules:\n  - name: '{}'\n    match: {{ path: /x }} # {}\n    business: 1\n",
        "[".repeat(100),
        "{".repeat(100)
    );
    PriorityTable::from_yaml(&quoted).unwrap();
    assert!(started.elapsed() < std::time::Duration::from_secs(1), "{:?}", started.elapsed());
}

/// Fuzz finding (fuzz/fuzz_targets/table.rs): a table accepted as JSON with `[` in a rule
/// name or path was persisted as YAML with those brackets in a plain scalar, which the
/// nesting check counted, so the state file was refused at the next start. Brackets open a
/// collection only where a node starts (or inside a flow collection), and a quote starts a
/// quoted scalar only there too: a quote inside a plain scalar (`it's`) hid the rest of
/// its line from the check, so a nesting the parser takes quadratic time on got through.
#[test]
fn nesting_counts_collections_not_brackets_in_plain_scalars() {
    let brackets = "[".repeat(100);
    let json = format!(
        r#"{{"rules": [{{"name": "x{brackets}", "match": {{"path_prefix": "/a{brackets}"}}, "business": 1}}]}}"#
    );
    let table = PriorityTable::from_json(&json).unwrap();
    assert_eq!(PriorityTable::from_yaml(&table.to_yaml()).unwrap(), table);
    // In a single-quoted scalar `''` is a quote, not its end; after the end, text again.
    let names =
        [format!("'it''s {brackets}'"), format!("'x' # {brackets}"), format!("'x''' #{brackets}")];
    for name in names {
        let yaml =
            format!("rules:\n  - name: {name}\n    match: {{ path: /x }}\n    business: 1\n");
        PriorityTable::from_yaml(&yaml).unwrap();
    }
    let started = std::time::Instant::now();
    let deep = "[".repeat(200_000);
    for hidden in
        [format!("[it's, {deep}"), format!("a: it's {{b: {deep}"), format!("['x', {deep}")]
    {
        let e = PriorityTable::from_yaml(&hidden).unwrap_err();
        assert!(e.to_string().contains("nested more than"), "{e}");
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(1), "{:?}", started.elapsed());
}

/// Fuzz finding (fuzz/fuzz_targets/table.rs): a rule name with a line break, accepted as
/// JSON, was persisted as a YAML block scalar whose lines the nesting check counted, so the
/// state file was refused at the next start. Names are one line of text.
#[test]
fn rule_names_are_one_line() {
    for name in ["a\nb", "a\rb", "a\tb", "a\u{85}b", "a\u{2028}b", "a\u{1b}[31m"] {
        let json = serde_json::json!({
            "rules": [{ "name": name, "match": { "path": "/x" }, "business": 1 }]
        });
        let e = PriorityTable::from_json(&json.to_string()).unwrap_err();
        assert_eq!(e.0[0].path, "rules[0].name", "{name:?}: {e}");
    }
}

#[test]
fn empty_documents_are_refused() {
    for body in ["", "  \n\t\n"] {
        let e = PriorityTable::from_yaml(body).unwrap_err();
        assert!(e.to_string().contains("empty"), "{e}");
        assert!(PriorityTable::from_json(body).is_err());
    }
}

#[test]
fn rule_paths_must_be_normalised() {
    let e = PriorityTable::from_yaml(
        "rules:\n  - { name: a, match: { path_prefix: /api//pay/ }, business: 1 }\n  \
         - { name: b, match: { path: /x/%2e%2e/y }, business: 1 }\n  \
         - { name: c, match: { path: /x/%2F }, business: 1 }\n",
    )
    .unwrap_err();
    let paths: Vec<_> = e.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["rules[0].match.path_prefix", "rules[1].match.path", "rules[2].match.path"]);
    assert!(e.0[0].message.contains("`/api/pay/`"), "{e}");
}

/// 60 rules of 1,000 header matches each: the shadowing check used to compare every
/// header of every rule pair with every other (9 s for this table); now it is well under
/// a second even in a debug build.
#[test]
fn many_header_matches_validate_fast() {
    let mut yaml = String::from("rules:\n");
    for r in 0..60 {
        // Same names and values in every rule but one value: nothing shadows anything, and
        // telling so compares most headers of every pair.
        let headers: Vec<String> =
            (0..1000).map(|h| format!("h{h}: {}", if h == 999 { r } else { 0 })).collect();
        yaml.push_str(&format!(
            "  - {{ name: r{r}, business: 1, match: {{ header: {{ {} }} }} }}\n",
            headers.join(", ")
        ));
    }
    assert!(yaml.len() < 1 << 20, "fits the body limit: {}", yaml.len());
    let started = std::time::Instant::now();
    let table = PriorityTable::from_yaml(&yaml).unwrap();
    table.compile().unwrap();
    let took = started.elapsed();
    assert!(took < std::time::Duration::from_secs(3), "{took:?}");
}

#[test]
fn an_omitted_user_section_means_the_default_impl() {
    let t = PriorityTable::from_yaml("rules: []\n").unwrap();
    assert_eq!(t.user, UserConfig::default());
    assert_eq!(t.default_business, DEFAULT_BUSINESS);
}
