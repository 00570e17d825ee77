use super::*;

fn p(business: u8, user: u8) -> Priority {
    Priority::new(business, user).expect("user in range")
}

#[test]
fn order_is_business_first_then_user() {
    assert!(p(0, 127) < p(1, 0), "any business 0 beats business 1");
    assert!(p(3, 10) < p(3, 11));
    assert!(Priority::MOST_IMPORTANT < Priority::LEAST_IMPORTANT);
    let mut v = vec![p(2, 5), p(1, 100), p(2, 0), p(0, 127)];
    v.sort();
    assert_eq!(v, vec![p(0, 127), p(1, 100), p(2, 0), p(2, 5)]);
}

#[test]
fn compound_is_dense_and_order_preserving() {
    assert_eq!(p(0, 0).compound(), 0);
    assert_eq!(p(1, 0).compound(), 128);
    assert_eq!(p(3, 64).compound(), 3 * 128 + 64);
    assert_eq!(Priority::LEAST_IMPORTANT.compound() as usize, COMPOUND_LEVELS - 1);
    for c in [0u16, 1, 127, 128, 4000, (COMPOUND_LEVELS - 1) as u16] {
        assert_eq!(Priority::from_compound(c).map(Priority::compound), Some(c));
    }
    assert_eq!(Priority::from_compound(COMPOUND_LEVELS as u16), None);
    assert!(Priority::new(0, 128).is_none());
}

#[test]
fn level_admits_itself_and_everything_more_important() {
    let level = AdmissionLevel::new(p(3, 64));
    assert!(level.admits(p(3, 64)));
    assert!(level.admits(p(3, 0)));
    assert!(level.admits(p(0, 127)));
    assert!(!level.admits(p(3, 65)));
    assert!(!level.admits(p(4, 0)));
    assert!(AdmissionLevel::FULLY_OPEN.admits(Priority::LEAST_IMPORTANT));
    assert_eq!(AdmissionLevel::default(), AdmissionLevel::FULLY_OPEN);
}

#[test]
fn level_header_round_trips() {
    for (b, u, text) in [(3, 64, "3.64"), (0, 0, "0.0"), (255, 127, "255.127"), (10, 9, "10.9")] {
        let level = AdmissionLevel::new(p(b, u));
        let enc = level.encode();
        assert_eq!(enc.as_str(), text);
        assert_eq!(enc.as_bytes(), text.as_bytes());
        assert_eq!(level.to_string(), text);
        assert_eq!(AdmissionLevel::parse(text.as_bytes()), Ok(level));
    }
}

#[test]
fn every_level_round_trips() {
    for c in 0..COMPOUND_LEVELS as u16 {
        let level = AdmissionLevel::from_compound(c).expect("in range");
        assert_eq!(AdmissionLevel::parse(level.encode().as_bytes()), Ok(level));
    }
}

#[test]
fn business_and_user_values() {
    assert_eq!(parse_business(b"0"), Ok(0));
    assert_eq!(parse_business(b"255"), Ok(255));
    assert_eq!(parse_business(b"007"), Ok(7), "zero-padded digits are a number");
    assert_eq!(parse_user(b"127"), Ok(127));
    assert_eq!(parse_user(b"77"), Ok(77));
}

#[test]
fn bad_values_give_typed_errors() {
    use HeaderValueError::*;
    assert_eq!(parse_business(b""), Err(Empty));
    assert_eq!(parse_business(b" 3"), Err(Padded));
    assert_eq!(parse_business(b"3\t"), Err(Padded));
    assert_eq!(parse_business(b"-1"), Err(Negative));
    assert_eq!(parse_business(b"+1"), Err(NotNumeric));
    assert_eq!(parse_business(b"3a"), Err(NotNumeric));
    assert_eq!(parse_business(b"3,4"), Err(NotNumeric), "a folded repeated header");
    assert_eq!(parse_business(b"1.5"), Err(NotNumeric));
    assert_eq!(parse_business(b"256"), Err(OutOfRange { max: 255 }));
    assert_eq!(parse_business(b"99999999999999999999"), Err(OutOfRange { max: 255 }));
    assert_eq!(parse_user(b"128"), Err(OutOfRange { max: 127 }));
    assert_eq!(parse_user(b"\xff"), Err(NotNumeric));
}

#[test]
fn bad_levels_give_typed_errors() {
    use HeaderValueError::*;
    assert_eq!(AdmissionLevel::parse(b""), Err(Empty));
    assert_eq!(AdmissionLevel::parse(b"3"), Err(MissingSeparator));
    assert_eq!(AdmissionLevel::parse(b"3."), Err(Empty));
    assert_eq!(AdmissionLevel::parse(b".3"), Err(Empty));
    assert_eq!(AdmissionLevel::parse(b"3.1.2"), Err(NotNumeric));
    assert_eq!(AdmissionLevel::parse(b"3.128"), Err(OutOfRange { max: 127 }));
    assert_eq!(AdmissionLevel::parse(b"256.0"), Err(OutOfRange { max: 255 }));
    assert_eq!(AdmissionLevel::parse(b" 3.4"), Err(Padded));
    assert_eq!(AdmissionLevel::parse(b"3 .4"), Err(NotNumeric));
    assert_eq!(AdmissionLevel::parse(b"-3.4"), Err(Negative));
    assert_eq!(AdmissionLevel::parse(b"3.-4"), Err(Negative));
}
