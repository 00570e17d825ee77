use super::*;
use rand::{rngs::StdRng, SeedableRng};
use rand_distr::{Distribution, LogNormal};

fn grade_with(sub_bits: u8) -> SizeGrade {
    SizeGrade::new(&SizeGradeConfig { sub_bits, ..SizeGradeConfig::default() }).expect("valid")
}

#[test]
fn default_spans_one_business_class_per_doubling() {
    let g = SizeGrade::new(&SizeGradeConfig::default()).expect("valid");
    assert_eq!(g.grades(), 18 * 128);
    assert_eq!(g.business_classes(), 100..=117);
    // Largest size: most important slot; smallest: least important.
    assert_eq!(g.priority(u64::MAX), Priority { business: 100, user: 0 });
    assert_eq!(g.priority(0), Priority { business: 117, user: 127 });
    // One doubling is one business class, the sub-step is the user level.
    assert_eq!(g.priority(4096).business + 1, g.priority(2048).business);
    assert_eq!(g.priority(4096).user, 127);
    assert_eq!(g.priority(8191).user, 0);
}

#[test]
fn sub_steps_follow_the_bits_after_the_leading_one() {
    let g = grade_with(2);
    // 64..128 splits into 64, 80, 96, 112.
    let grades: Vec<u16> =
        [64, 79, 80, 95, 96, 112, 127, 128].iter().map(|&n| g.grade(n)).collect();
    assert_eq!(grades, [0, 0, 1, 1, 2, 3, 3, 4]);
}

#[test]
fn small_minimums_shift_instead_of_losing_bits() {
    let g = SizeGrade::new(&SizeGradeConfig {
        min_bytes: 1,
        max_bytes: 1 << 10,
        sub_bits: 3,
        ..Default::default()
    })
    .expect("valid");
    // Below 2^sub_bits every length is its own grade region, still monotonic.
    let mut last = 0;
    for n in 1..1024u64 {
        let gr = g.grade(n);
        assert!(gr >= last, "grade fell at {n}");
        last = gr;
    }
    assert_eq!(g.grade(1), 0);
    assert_eq!(g.grade(1023), g.grades() - 1);
}

#[test]
fn larger_is_more_important_and_configurable() {
    let big_first = SizeGrade::new(&SizeGradeConfig::default()).expect("valid");
    let small_first =
        SizeGrade::new(&SizeGradeConfig { larger_is_more_important: false, ..Default::default() })
            .expect("valid");
    let mut prev = (big_first.priority(0), small_first.priority(0));
    for shift in 0..40u32 {
        for extra in [0u64, 1, 3, 7] {
            let n = (1u64 << shift) + (extra << shift.saturating_sub(3));
            let now = (big_first.priority(n), small_first.priority(n));
            assert!(now.0 <= prev.0, "bigger must not be less important at {n}");
            assert!(now.1 >= prev.1, "bigger must not be more important at {n} when reversed");
            prev = now;
        }
    }
    assert_eq!(small_first.priority(0), Priority { business: 100, user: 0 });
}

#[test]
fn invalid_configs_name_their_fields() {
    let errs = SizeGrade::new(&SizeGradeConfig {
        min_bytes: 100,
        max_bytes: 0,
        sub_bits: 9,
        ..Default::default()
    })
    .expect_err("invalid");
    let fields: Vec<_> = errs.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(fields, ["min_bytes", "max_bytes", "sub_bits"]);
    let errs = SizeGradeConfig { min_bytes: 64, max_bytes: 64, ..Default::default() }
        .validate()
        .expect_err("empty");
    assert_eq!(errs[0].path, "max_bytes");
    let errs = SizeGradeConfig { business: 250, ..Default::default() }
        .validate()
        .expect_err("too many classes");
    assert_eq!(errs[0].path, "business");
    assert!(errs[0].to_string().starts_with("business: "), "{}", errs[0]);
    assert!(
        SizeGradeConfig { business: 238, ..Default::default() }.validate().is_ok(),
        "238 + 18 = 256 fits"
    );
}

#[test]
fn yaml_config_with_defaults() {
    let cfg: SizeGradeConfig = serde_yaml::from_str("business: 150\nsub_bits: 4\n").expect("yaml");
    assert_eq!(cfg, SizeGradeConfig { business: 150, sub_bits: 4, ..Default::default() });
    assert!(serde_yaml::from_str::<SizeGradeConfig>("bussiness: 1").is_err());
}

/// Population share of each grade for sizes clustered tightly around 3 kB (about +-20%).
fn clustered_shares(g: &SizeGrade) -> Vec<f64> {
    let mut rng = StdRng::seed_from_u64(3);
    let sizes = LogNormal::new((3000f64).ln(), 0.2).expect("valid lognormal");
    let n = 100_000;
    let mut counts = vec![0u32; g.grades() as usize];
    for _ in 0..n {
        counts[g.grade(sizes.sample(&mut rng) as u64) as usize] += 1;
    }
    counts.iter().map(|&c| c as f64 / n as f64).collect()
}

/// The shed fraction closest to `target` that any level of the dial can produce.
fn best_shed(shares: &[f64], target: f64) -> f64 {
    let mut shed_below = 0.0; // grades ascend with size, so the smallest are shed first
    let mut best = 0.0f64;
    for s in shares {
        shed_below += s;
        if (shed_below - target).abs() < (best - target).abs() {
            best = shed_below;
        }
    }
    best
}

#[test]
fn fine_sub_steps_remove_the_cliff() {
    let coarse = clustered_shares(&grade_with(0));
    let fine = clustered_shares(&grade_with(7));
    let max = |v: &[f64]| v.iter().cloned().fold(0.0, f64::max);
    let max_adjacent = |v: &[f64]| v.windows(2).map(|w| (w[0] - w[1]).abs()).fold(0.0, f64::max);
    // The one-grade-per-doubling staircase puts most of the cluster behind one notch.
    assert!(max(&coarse) > 0.4, "coarse grades: biggest notch {:.3}", max(&coarse));
    // Fine sub-steps: no notch holds more than 2% of the traffic and neighbours are alike.
    assert!(max(&fine) < 0.02, "fine grades: biggest notch {:.4}", max(&fine));
    assert!(max_adjacent(&fine) < 0.01, "fine grades: adjacent jump {:.4}", max_adjacent(&fine));
    // So the dial can land within 1 pp of any shed target, where the staircase cannot.
    for target in [0.1, 0.25, 0.5, 0.75] {
        let got = best_shed(&fine, target);
        assert!((got - target).abs() < 0.01, "fine: target {target} best {got:.4}");
    }
    assert!((best_shed(&coarse, 0.5) - 0.5).abs() > 0.1, "the staircase should miss drop-half");
}
