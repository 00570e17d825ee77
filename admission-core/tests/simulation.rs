//! The control loop against the deterministic simulator (`examples/simulate`): the
//! DESIGN §9 overload targets, asserted with margins on steady-state summaries.

#[allow(dead_code)]
#[path = "../examples/simulate/sim.rs"]
mod sim;

use admission_core::{EngineConfig, Law};
use sim::{SimConfig, Summary};

fn simulate(law: Law, phases: &[f64], classes: u8, seconds: u32) -> Summary {
    sim::run(&SimConfig {
        phases: phases.to_vec(),
        classes,
        seconds,
        engine: EngineConfig { law, ..EngineConfig::default() },
        ..SimConfig::default()
    })
}

fn check_overload_targets(load: f64, classes: u8) {
    let s = simulate(Law::Goodput, &[load], classes, 40);
    let ctx = format!("load {load}x, {classes} classes: {s:#?}");
    assert!(s.goodput_ratio >= 0.95, "goodput {:.4}; {ctx}", s.goodput_ratio);
    assert!(s.shed_error_pp.abs() <= 1.0, "shed off by {:.2} pp; {ctx}", s.shed_error_pp);
    let top = &s.classes[0];
    if top.load <= 0.9 {
        assert!(top.success >= 0.995, "top class success {:.4}; {ctx}", top.success);
    }
    // Steady queuing stays near the threshold, far from the 500 ms task timeout.
    assert!(s.mean_queuing_ms < 40.0, "mean queuing {:.1} ms; {ctx}", s.mean_queuing_ms);
}

#[test]
fn three_classes_at_1_5x() {
    check_overload_targets(1.5, 3);
}

#[test]
fn three_classes_at_3x() {
    check_overload_targets(3.0, 3);
}

#[test]
fn three_classes_at_6x() {
    check_overload_targets(6.0, 3);
}

#[test]
fn one_class_at_1_5x() {
    check_overload_targets(1.5, 1);
}

#[test]
fn one_class_at_3x() {
    check_overload_targets(3.0, 1);
}

#[test]
fn one_class_at_6x() {
    check_overload_targets(6.0, 1);
}

#[test]
fn shed_lowest_class_first() {
    let s = simulate(Law::Goodput, &[1.5], 3, 30);
    let success: Vec<f64> = s.classes.iter().map(|c| c.success).collect();
    assert!(success[0] >= success[1] && success[1] >= success[2], "{success:?}");
    assert!(success[2] < 0.1, "the least important class should carry the cut: {success:?}");
}

#[test]
fn default_law_settles_fast_after_a_step_both_ways() {
    let s = simulate(Law::Goodput, &[0.5, 3.0, 0.5], 3, 60);
    let up = s.settle_windows[0].expect("settles after the step up");
    let down = s.settle_windows[1].expect("settles after the step down");
    assert!(up <= 5, "step up took {up} windows: {s:#?}");
    assert!(down <= 3, "step down took {down} windows: {s:#?}");
    assert!(s.phase_oscillation[1] < 0.05, "oscillation at 3x: {:?}", s.phase_oscillation);
}

#[test]
fn below_capacity_nothing_is_shed() {
    let s = simulate(Law::Goodput, &[0.7], 3, 20);
    assert!(s.shed_fraction < 0.001, "shed {:.4} at 0.7x", s.shed_fraction);
    assert!(s.classes.iter().all(|c| c.success > 0.999), "{:?}", s.classes);
}

/// The paper's law is slow but must still get there: well cut within the run.
#[test]
fn dagor_law_converges_at_3x() {
    let s = simulate(Law::Dagor, &[3.0], 3, 60);
    assert!(s.goodput_ratio >= 0.9, "dagor goodput {:.4}", s.goodput_ratio);
    assert!(s.shed_error_pp.abs() <= 3.0, "dagor shed off by {:.2} pp", s.shed_error_pp);
}

#[test]
fn same_seed_same_run() {
    let a = simulate(Law::Goodput, &[3.0], 3, 5);
    let b = simulate(Law::Goodput, &[3.0], 3, 5);
    assert_eq!(format!("{a:?}"), format!("{b:?}"));
}
