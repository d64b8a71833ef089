//! Composed helpers (softmax family, RMS norm, SiLU, MSE) against host f64
//! math, and their gradients against finite differences.

mod common;

use common::check::{Input, check_forward, check_gradient};
use common::cpu_client;
use grpo_xla::trace::Tensor;

/// Row-wise host softmax over the last axis of rows of length `n`.
fn host_softmax(x: &[f64], n: usize) -> Vec<f64> {
    x.chunks(n)
        .flat_map(|row| {
            let m = row.iter().copied().fold(f64::MIN, f64::max);
            let sum: f64 = row.iter().map(|v| (v - m).exp()).sum();
            row.iter().map(move |v| (v - m).exp() / sum).collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn softmax_family_matches_host_and_is_stable() {
    let client = cpu_client(1);
    let x = [Input::range(&[3, 5], -4.0, 4.0)];
    check_forward(&client, &x, |p| p[0].softmax(1), |v| host_softmax(&v[0], 5), 1e-12);
    check_forward(
        &client,
        &x,
        |p| p[0].log_softmax(1),
        |v| host_softmax(&v[0], 5).iter().map(|p| p.ln()).collect(),
        1e-12,
    );
    check_forward(
        &client,
        &x,
        |p| p[0].logsumexp(1),
        |v| {
            v[0].chunks(5)
                .map(|r| r.iter().map(|x| x.exp()).sum::<f64>().ln())
                .collect()
        },
        1e-12,
    );
    // Logits around 1000 would overflow a naive exp.
    let large = [Input::range(&[2, 4], 995.0, 1005.0)];
    check_forward(&client, &large, |p| p[0].softmax(1), |v| host_softmax(&v[0], 4), 1e-12);
    type Op = fn(&Tensor) -> grpo_xla::Result<Tensor>;
    let ops: [Op; 3] = [|t| t.softmax(1), |t| t.log_softmax(1), |t| t.logsumexp(1)];
    for op in ops {
        check_gradient(&client, &x, |p| op(&p[0]));
    }
    check_gradient(&client, &[Input::new(&[2, 3, 4])], |p| p[0].softmax(0));
}

#[test]
fn rms_norm_silu_relu_and_mse() {
    let client = cpu_client(1);
    let inputs = [Input::new(&[2, 3, 4]), Input::range(&[4], 0.5, 1.5)];
    let eps = 1e-5;
    check_forward(
        &client,
        &inputs,
        |p| p[0].rms_norm(&p[1], eps),
        |v| {
            v[0].chunks(4)
                .flat_map(|row| {
                    let scale = 1.0 / (row.iter().map(|x| x * x).sum::<f64>() / 4.0 + eps).sqrt();
                    row.iter()
                        .zip(&v[1])
                        .map(move |(x, w)| x * scale * w)
                        .collect::<Vec<_>>()
                })
                .collect()
        },
        1e-12,
    );
    check_gradient(&client, &inputs, |p| p[0].rms_norm(&p[1], eps));
    let x = [Input::range(&[7], -3.0, 3.0)];
    check_forward(
        &client,
        &x,
        |p| p[0].silu(),
        |v| v[0].iter().map(|x| x / (1.0 + (-x).exp())).collect(),
        1e-12,
    );
    check_gradient(&client, &x, |p| p[0].silu());
    check_forward(
        &client,
        &x,
        |p| p[0].relu(),
        |v| v[0].iter().map(|x| x.max(0.0)).collect(),
        0.0,
    );
    let pair = [Input::new(&[3, 2]), Input::new(&[3, 2])];
    check_forward(
        &client,
        &pair,
        |p| p[0].mse(&p[1]),
        |v| vec![v[0].iter().zip(&v[1]).map(|(a, b)| (a - b) * (a - b)).sum::<f64>() / 6.0],
        1e-12,
    );
    check_gradient(&client, &pair, |p| p[0].mse(&p[1]));
}

#[test]
fn gathered_log_probs_and_cross_entropy() {
    let client = cpu_client(1);
    let ids: [i32; 6] = [4, 0, 2, 2, 1, 3];
    let logits = [Input::range(&[2, 3, 5], -3.0, 3.0)];
    let ids_of = |p: &Tensor| p.graph().constant(&ids, &[2, 3]);
    let host_log_probs = |v: &[Vec<f64>]| -> Vec<f64> {
        host_softmax(&v[0], 5)
            .chunks(5)
            .zip(ids)
            .map(|(row, id)| row[id as usize].ln())
            .collect()
    };
    check_forward(
        &client,
        &logits,
        |p| p[0].gathered_log_probs(&ids_of(&p[0])?),
        host_log_probs,
        1e-12,
    );
    check_forward(
        &client,
        &logits,
        |p| p[0].cross_entropy(&ids_of(&p[0])?),
        |v| vec![-host_log_probs(v).iter().sum::<f64>() / 6.0],
        1e-12,
    );
    check_gradient(&client, &logits, |p| p[0].gathered_log_probs(&ids_of(&p[0])?));
    check_gradient(&client, &logits, |p| p[0].cross_entropy(&ids_of(&p[0])?));

    let graph = grpo_xla::trace::Graph::new("bad");
    let x = graph.parameter(grpo_xla::ElementType::F32, &[2, 3, 5]).unwrap();
    let wrong = graph.constant(&[0i32; 3], &[3]).unwrap();
    let error = x.gathered_log_probs(&wrong).unwrap_err().to_string();
    assert!(error.starts_with("gathered_log_probs"), "{error}");
}
