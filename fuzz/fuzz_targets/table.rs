//! The priority table documents the control API, the table file and the state file accept
//! (`admission-core/src/table`): YAML or JSON text, parsed, range-checked and validated.
//!
//! The input's first byte picks the format (even: YAML, odd: JSON); the rest is the text.
//!
//! Properties: an accepted table validates and compiles; it re-serialises, as the control API
//! answers it and as the state file persists it, to a document that parses back to the same
//! table in both formats (so a restart never loses an accepted table); a refused document
//! names at least one problem; every rule's own example request is classified by that rule or
//! an earlier one, with that rule's business priority.
#![no_main]

use admission_core::table::{PriorityTable, RequestView, Rule};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Some((&format, text)) = input.split_first() else { return };
    let Ok(text) = std::str::from_utf8(text) else { return };
    let parsed = if format % 2 == 0 {
        PriorityTable::from_yaml(text)
    } else {
        PriorityTable::from_json(text)
    };
    let table = match parsed {
        Ok(table) => table,
        Err(errors) => {
            assert!(!errors.is_empty(), "refused without a reason");
            assert!(errors.iter().all(|e| !e.message.is_empty()));
            return;
        }
    };
    assert!(table.validate().is_empty(), "accepted an invalid table");
    let compiled = table.compile().expect("an accepted table compiles");

    let yaml = table.to_yaml();
    match PriorityTable::from_yaml(&yaml) {
        Ok(back) => assert_eq!(back, table, "YAML round trip of\n{yaml}"),
        Err(e) => panic!("the persisted YAML is refused: {e}\n{yaml}"),
    }
    let json = table.to_json_pretty();
    match PriorityTable::from_json(&json) {
        Ok(back) => assert_eq!(back, table, "JSON round trip of\n{json}"),
        Err(e) => panic!("the served JSON is refused: {e}\n{json}"),
    }

    for (i, rule) in table.rules.iter().enumerate() {
        let verdict = compiled.classify(&Example(rule));
        let j = verdict.rule.expect("a rule's own example matches no rule");
        assert!(j <= i, "rules[{i}]'s example classified by the later rules[{j}]");
        assert_eq!(verdict.business, table.rules[j].business);
    }
});

/// A request that meets every condition of its rule.
struct Example<'a>(&'a Rule);

impl RequestView for Example<'_> {
    fn method(&self) -> &str {
        self.0.matches.method.as_deref().unwrap_or("GET")
    }

    fn path(&self) -> &str {
        let m = &self.0.matches;
        m.path.as_deref().or(m.path_prefix.as_deref()).unwrap_or("/")
    }

    fn host(&self) -> Option<&str> {
        self.0.matches.host.as_deref()
    }

    fn header(&self, name: &str) -> Option<&[u8]> {
        let mut headers = self.0.matches.header.iter();
        headers.find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_bytes())
    }
}
