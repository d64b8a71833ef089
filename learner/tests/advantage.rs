//! Group advantages against hand-computed values (TRL's formulas: unbiased
//! std, 1e-4 below every division), skipped samples, and refusals.

use grpo_learner::advantage::{ScaleRewards, advantages};

fn close(got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert!((f64::from(*g) - w).abs() < 1e-5, "{got:?} vs {want:?}");
    }
}

#[test]
fn each_scaling_matches_hand_computed_values() {
    // Groups [1, 0, 0, 1] (mean 0.5, std sqrt(1/3)) and [2, 4, 6, 8] (mean 5, std sqrt(20/3)).
    let rewards: Vec<Option<f32>> = [1.0, 0.0, 0.0, 1.0, 2.0, 4.0, 6.0, 8.0].map(Some).to_vec();
    let g1 = (1.0f64 / 3.0).sqrt() + 1e-4;
    let g2 = (20.0f64 / 3.0).sqrt() + 1e-4;
    let group = advantages(&rewards, 4, ScaleRewards::Group).unwrap();
    close(
        &group.values,
        &[
            0.5 / g1,
            -0.5 / g1,
            -0.5 / g1,
            0.5 / g1,
            -3.0 / g2,
            -1.0 / g2,
            1.0 / g2,
            3.0 / g2,
        ],
    );
    // The batch std of all eight rewards: mean 2.75, Σ(r − mean)² = 61.5, /7.
    let batch_std = (61.5f64 / 7.0).sqrt() + 1e-4;
    let batch = advantages(&rewards, 4, ScaleRewards::Batch).unwrap();
    close(
        &batch.values,
        &[0.5, -0.5, -0.5, 0.5, -3.0, -1.0, 1.0, 3.0].map(|a| a / batch_std),
    );
    let none = advantages(&rewards, 4, ScaleRewards::None).unwrap();
    close(&none.values, &[0.5, -0.5, -0.5, 0.5, -3.0, -1.0, 1.0, 3.0]);
    assert_eq!(none.zero_std, [false, false]);
}

#[test]
fn skipped_samples_and_constant_groups() {
    let rewards = vec![Some(1.0), None, Some(3.0), Some(0.5), Some(0.5), Some(0.5)];
    let a = advantages(&rewards, 3, ScaleRewards::Group).unwrap();
    // Group 1 without its skipped sample: [1, 3], mean 2, std sqrt(2).
    let s = 2f64.sqrt() + 1e-4;
    close(&a.values, &[-1.0 / s, 0.0, 1.0 / s, 0.0, 0.0, 0.0]);
    assert_eq!(a.valid, [true, false, true, true, true, true]);
    assert_eq!(a.zero_std, [false, true]);
    assert_eq!(a.frac_zero_std(), 0.5);
    assert_eq!(a.informative_groups(), [0]);
}

#[test]
fn bad_groups_are_refused_naming_the_problem() {
    let four = vec![Some(1.0); 4];
    let message = |e: grpo_learner::Error| e.to_string();
    assert!(message(advantages(&four, 1, ScaleRewards::Group).unwrap_err()).contains("group_size"));
    assert!(message(advantages(&four, 3, ScaleRewards::Group).unwrap_err()).contains("groups of 3"));
    let nan = vec![Some(1.0), Some(f32::NAN)];
    assert!(message(advantages(&nan, 2, ScaleRewards::Group).unwrap_err()).contains("finite"));
}
