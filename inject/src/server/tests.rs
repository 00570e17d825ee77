use super::WarnGate;

#[test]
fn the_warn_gate_lets_one_warning_a_second_through() {
    let gate = WarnGate::default();
    assert!(gate.allow(), "the first one passes");
    let passed = (0..1000).filter(|_| gate.allow()).count();
    // A thousand calls take far less than a second; allow one boundary crossing.
    assert!(passed <= 1, "{passed} passed in a burst");
}
