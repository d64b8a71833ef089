//! dot_general and matmul: forward against host loops, gradients against
//! finite differences, for plain, batched and unusual dimension numbers.

mod common;

use common::check::{Input, check_forward, check_gradient};
use common::{cpu_client, matmul_f64};

#[test]
fn matmul_forward_matches_host() {
    let client = cpu_client(1);
    let (m, k, n) = (3, 5, 4);
    check_forward(
        &client,
        &[Input::new(&[m, k]), Input::new(&[k, n])],
        |p| p[0].matmul(&p[1]),
        |v| matmul_f64(&v[0], &v[1], m as usize, k as usize, n as usize).0,
        1e-12,
    );
}

#[test]
fn dot_general_gradients_for_many_dimension_numbers() {
    let client = cpu_client(1);
    // plain matmul
    check_gradient(&client, &[Input::new(&[3, 4]), Input::new(&[4, 2])], |p| {
        p[0].matmul(&p[1])
    });
    // batched matmul [b, m, k] · [b, k, n]
    check_gradient(&client, &[Input::new(&[2, 3, 4]), Input::new(&[2, 4, 3])], |p| {
        p[0].matmul(&p[1])
    });
    // batch on a middle dimension, contracting on the first: [k, b, m] · [b, n, k]
    check_gradient(&client, &[Input::new(&[4, 2, 3]), Input::new(&[2, 3, 4])], |p| {
        p[0].dot_general(&p[1], &[1], &[0], &[0], &[2])
    });
    // two contracting dimensions in swapped order: [k1, m, k2] · [k2, k1, n]
    check_gradient(&client, &[Input::new(&[2, 3, 4]), Input::new(&[4, 2, 3])], |p| {
        p[0].dot_general(&p[1], &[], &[], &[0, 2], &[1, 0])
    });
    // a run of contracting dimensions (merged into one before emission), with and without batch after it
    check_gradient(&client, &[Input::new(&[2, 3, 4]), Input::new(&[2, 3, 5])], |p| {
        p[0].dot_general(&p[1], &[], &[], &[0, 1], &[0, 1])
    });
    check_gradient(&client, &[Input::new(&[2, 3, 4]), Input::new(&[4, 2, 3])], |p| {
        p[0].dot_general(&p[1], &[2], &[0], &[0, 1], &[1, 2])
    });
    // a run between free dimensions, moved last in the lhs before merging: [m, k1, k2, p] · [k1, k2, n]
    check_gradient(&client, &[Input::new(&[2, 3, 2, 2]), Input::new(&[3, 2, 3])], |p| {
        p[0].dot_general(&p[1], &[], &[], &[1, 2], &[0, 1])
    });
    // x · wᵀ with w [n, k], whose gradient is taken as g · x: [b, t, k] · [n, k]
    check_gradient(&client, &[Input::new(&[2, 3, 4]), Input::new(&[5, 4])], |p| {
        p[0].dot_general(&p[1], &[], &[], &[2], &[1])
    });
    // matrix · vector and an outer-free rhs: [m, k] · [k]
    check_gradient(&client, &[Input::new(&[3, 4]), Input::new(&[4])], |p| {
        p[0].matmul(&p[1])
    });
    // batched [b, h, t, d] · [b, h, d, t] as in attention scores
    check_gradient(&client, &[Input::new(&[1, 2, 3, 2]), Input::new(&[1, 2, 2, 3])], |p| {
        p[0].matmul(&p[1])
    });
}

#[test]
fn a_contracting_run_matches_host_math() {
    let client = cpu_client(1);
    // out[i][j] = Σ_{a,b} x[a][b][i] · y[a][b][j]
    check_forward(
        &client,
        &[Input::new(&[2, 3, 4]), Input::new(&[2, 3, 5])],
        |p| p[0].dot_general(&p[1], &[], &[], &[0, 1], &[0, 1]),
        |v| {
            let mut out = vec![0.0; 20];
            for i in 0..4 {
                for j in 0..5 {
                    for ab in 0..6 {
                        out[i * 5 + j] += v[0][ab * 4 + i] * v[1][ab * 5 + j];
                    }
                }
            }
            out
        },
        1e-12,
    );
}

#[test]
fn mismatched_dimensions_are_refused_while_tracing() {
    let graph = grpo_xla::trace::Graph::new("bad");
    let a = graph.parameter(grpo_xla::ElementType::F32, &[3, 4]).unwrap();
    let b = graph.parameter(grpo_xla::ElementType::F32, &[5, 2]).unwrap();
    let error = a.matmul(&b).unwrap_err().to_string();
    assert!(
        error.starts_with("dot_general") && error.contains("size 4") && error.contains("size 5"),
        "{error}"
    );
    let c = graph.parameter(grpo_xla::ElementType::Bf16, &[4, 2]).unwrap();
    let error = a.matmul(&c).unwrap_err().to_string();
    assert!(error.contains("different dtypes"), "{error}");
}
