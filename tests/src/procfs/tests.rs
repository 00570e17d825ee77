#[test]
fn reads_own_process() {
    let pid = std::process::id();
    assert!(super::rss_bytes(pid).is_some_and(|b| b > 0));
    assert!(super::cpu_time(pid).is_some());
}
