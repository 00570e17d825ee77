use proptest::prelude::*;

use super::*;
use crate::table::{PriorityTable, RequestView};

fn norm(p: &str) -> Result<String, PathError> {
    normalize_path(p).map(Cow::into_owned)
}

#[test]
fn normal_paths_are_borrowed_unchanged() {
    for p in ["/", "/api/pay/", "/api/pay/x", "/a;b", "/a.b/c..d", "*", "/~user/x-y_z"] {
        assert!(matches!(normalize_path(p), Ok(Cow::Borrowed(q)) if q == p), "{p}");
    }
}

#[test]
fn dot_segments_escapes_and_slashes() {
    for (raw, want) in [
        ("/api/pay/../../admin/delete", "/admin/delete"),
        ("/api/pay/%2e%2e/%2e%2e/admin", "/admin"),
        ("/api/pay/%2E%2e/x", "/api/x"),
        ("/api/pay/.%2e/x", "/api/x"),
        ("/a/./b", "/a/b"),
        ("/a/b/..", "/a/"),
        ("/a/b/.", "/a/b/"),
        ("//a///b//", "/a/b/"),
        ("/%61%70%69/pay", "/api/pay"),
        ("/a%3bb/%7e", "/a%3Bb/~"),
        ("/a%20b", "/a%20b"),
        ("/.well-known/x", "/.well-known/x"),
        ("/a/..", "/"),
        ("/./", "/"),
    ] {
        assert_eq!(norm(raw).as_deref(), Ok(want), "{raw}");
    }
}

#[test]
fn ambiguous_paths_are_refused() {
    for (raw, why) in [
        ("/api/pay%2F..%2Fadmin", PathError::EncodedSeparator),
        ("/api/pay%2f", PathError::EncodedSeparator),
        ("/api\\..\\admin", PathError::EncodedSeparator),
        ("/a%5Cb", PathError::EncodedSeparator),
        ("/a%00", PathError::EncodedNul),
        ("/..", PathError::AboveRoot),
        ("/a/../../b", PathError::AboveRoot),
        ("/%2e%2e/x", PathError::AboveRoot),
        ("/api/pay/..;/admin", PathError::DotSegmentWithParams),
        ("/api/.;x/admin", PathError::DotSegmentWithParams),
        ("/a%zz", PathError::BadEscape),
        ("/a%4", PathError::BadEscape),
        ("api/pay", PathError::NotAbsolute),
        ("", PathError::NotAbsolute),
    ] {
        assert_eq!(norm(raw), Err(why), "{raw}");
    }
}

/// What a typical app does with a raw path: decode every escape once, then resolve dots
/// (clamped at the root) and merge slashes. `None` where it would fail to decode.
fn app_resolves(raw: &str) -> Option<String> {
    let bytes = raw.as_bytes();
    let mut decoded = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let h = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            decoded.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            decoded.push(bytes[i]);
            i += 1;
        }
    }
    let decoded = String::from_utf8(decoded).ok()?;
    let mut kept: Vec<&str> = Vec::new();
    for segment in decoded.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                kept.pop();
            }
            s => kept.push(s),
        }
    }
    Some(format!("/{}", kept.join("/")))
}

struct Path<'a>(&'a str);

impl RequestView for Path<'_> {
    fn method(&self) -> &str {
        "GET"
    }
    fn path(&self) -> &str {
        self.0
    }
    fn host(&self) -> Option<&str> {
        None
    }
    fn header(&self, _: &str) -> Option<&[u8]> {
        None
    }
}

fn raw_path() -> impl Strategy<Value = String> {
    let segment = prop::sample::select(vec![
        "api", "pay", "admin", "delete", "login", "x", "", ".", "..", "%2e", "%2E%2e", ".%2e",
        "%61dmin", "%70ay", "%2F", "%2f", "..;", "a;b", "%3b", "%41", "%", "%zz", "%00", "~",
    ]);
    (prop::collection::vec(segment, 0..8), any::<bool>()).prop_map(|(segments, trailing)| {
        let mut p = format!("/{}", segments.join("/"));
        if trailing {
            p.push('/');
        }
        p
    })
}

fn table() -> crate::table::CompiledTable {
    PriorityTable::from_yaml(
        "rules:
  - { name: delete, match: { path: /admin/delete }, business: 0 }
  - { name: pay, match: { path_prefix: /api/pay/ }, business: 1 }
  - { name: admin, match: { path_prefix: /admin }, business: 2 }
  - { name: login, match: { path: /api/login }, business: 3 }
  - { name: api, match: { path_prefix: /api/ }, business: 4 }
",
    )
    .unwrap()
    .compile()
    .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

    /// A normalised path normalises to itself: the next hop cannot resolve it further.
    #[test]
    fn normalisation_is_idempotent(raw in raw_path()) {
        if let Ok(n) = normalize_path(&raw) {
            let again = normalize_path(&n);
            prop_assert_eq!(again.as_deref(), Ok(&*n));
        }
    }

    /// No path can match a rule its normalised form does not match, and the class the
    /// entry gives is the class of the resource the app resolves, whether the app sees the
    /// raw path or the forwarded normalised one.
    #[test]
    fn the_entry_classifies_what_the_app_serves(raw in raw_path()) {
        let table = table();
        if let Ok(n) = normalize_path(&raw) {
            let entry = table.classify(&Path(&n));
            let app_raw = app_resolves(&raw).expect("accepted paths decode");
            let app_forwarded = app_resolves(&n).expect("normal paths decode");
            prop_assert_eq!(&app_raw, &app_forwarded, "the app serves the same resource");
            // The app strips a trailing slash the table may see; compare with and without.
            let served = table.classify(&Path(&app_raw));
            let served_slash = table.classify(&Path(&format!("{app_raw}/")));
            prop_assert!(
                entry == served || entry == served_slash,
                "{raw} -> {n}: entry {entry:?}, app path {app_raw} gets {served:?}"
            );
        }
    }
}
