//! Comparing the learner's parameters between runs.

use grpo_model::weights::HostTensor;

/// The largest ‖got − want‖ / ‖want‖ over named tensors, with its name.
pub fn worst_relative_error(got: &[(String, HostTensor)], want: &[(String, HostTensor)]) -> (f64, String) {
    got.iter()
        .zip(want)
        .map(|((name, got), (_, want))| {
            let diff: f64 = got
                .data
                .iter()
                .zip(&want.data)
                .map(|(a, b)| f64::from(a - b).powi(2))
                .sum();
            let norm: f64 = want.data.iter().map(|b| f64::from(*b).powi(2)).sum();
            ((diff / norm.max(1e-30)).sqrt(), name.clone())
        })
        .fold((0.0, String::new()), |worst, e| if e.0 > worst.0 { e } else { worst })
}
