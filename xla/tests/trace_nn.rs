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

#[test]
fn chunked_linear_log_probs_match_the_plain_head_and_finite_differences() {
    check_linear_log_probs(1.0, None);
}

#[test]
fn tempered_linear_log_probs_match_the_plain_head_and_finite_differences() {
    check_linear_log_probs(1.7, None);
}

#[test]
fn soft_capped_linear_log_probs_match_the_plain_head_and_finite_differences() {
    // Logits reach ±12, so a cap of 1.5 bends most of them.
    check_linear_log_probs(1.3, Some(1.5));
}

/// The chunked head at `temperature` (after soft-capping at `softcap`)
/// against the host's f64 log-softmax of `cap·tanh(hidden · weightᵀ / cap)
/// / temperature` and against autodiff of the plain head.
fn check_linear_log_probs(temperature: f64, softcap: Option<f64>) {
    use grpo_xla::trace::{HeadScale, linear_log_probs};
    let scale = HeadScale { temperature, softcap };
    let cap = |z: f64| softcap.map_or(z, |c| c * (z / c).tanh());
    let client = cpu_client(1);
    let targets: [i32; 6] = [4, 0, 2, 2, 1, 3];
    let inputs = [Input::range(&[6, 3], -2.0, 2.0), Input::range(&[5, 3], -2.0, 2.0)];
    let fused = |p: &[Tensor]| -> grpo_xla::Result<Tensor> {
        let t = p[0].graph().constant(&targets, &[6])?;
        let (lp, ent) = linear_log_probs(&p[0], &p[1], &t, 2, scale)?;
        Tensor::concatenate(
            &[
                &lp.convert(grpo_xla::ElementType::F64)?,
                &ent.convert(grpo_xla::ElementType::F64)?,
            ],
            0,
        )
    };
    let host = |v: &[Vec<f64>]| -> Vec<f64> {
        let logits: Vec<f64> = (0..6)
            .flat_map(|i| (0..5).map(move |j| (i, j)))
            .map(|(i, j)| cap((0..3).map(|k| v[0][i * 3 + k] * v[1][j * 3 + k]).sum::<f64>()) / temperature)
            .collect();
        let p = host_softmax(&logits, 5);
        let lp: Vec<f64> = (0..6).map(|i| p[i * 5 + targets[i] as usize].ln()).collect();
        let ent: Vec<f64> = (0..6)
            .map(|i| -(0..5).map(|j| p[i * 5 + j] * p[i * 5 + j].ln()).sum::<f64>())
            .collect();
        lp.into_iter().chain(ent).collect()
    };
    // The head computes in f32, so compare at f32 precision.
    check_forward(&client, &inputs, fused, host, 1e-5);

    // Gradients of Σ a·lp + b·ent: the custom VJP against autodiff of the plain
    // head (itself checked by finite differences above), on the same f64 inputs.
    let graph = grpo_xla::trace::Graph::new("grads");
    let h = graph.parameter(grpo_xla::ElementType::F64, &[6, 3]).unwrap();
    let w = graph.parameter(grpo_xla::ElementType::F64, &[5, 3]).unwrap();
    let t = graph.constant(&targets, &[6]).unwrap();
    let a = graph.constant(&random_weights(6), &[6]).unwrap();
    let b = graph.constant(&random_weights(6), &[6]).unwrap();
    let weigh = |lp: &Tensor, ent: &Tensor| {
        lp.mul(&a)
            .unwrap()
            .add(&ent.mul(&b).unwrap())
            .unwrap()
            .sum_all()
            .unwrap()
    };
    let (lp, ent) = linear_log_probs(&h, &w, &t, 3, scale).unwrap();
    let f64 = |x: Tensor| x.convert(grpo_xla::ElementType::F64).unwrap();
    let fused_loss = weigh(&f64(lp), &f64(ent));
    let mut logits = h.dot_general(&w, &[], &[], &[1], &[1]).unwrap();
    if let Some(c) = softcap {
        logits = logits
            .mul_scalar(1.0 / c)
            .unwrap()
            .tanh()
            .unwrap()
            .mul_scalar(c)
            .unwrap();
    }
    let logits = logits.mul_scalar(1.0 / temperature).unwrap();
    let log_p = logits.log_softmax(1).unwrap();
    let plain_lp = logits.gathered_log_probs(&t).unwrap();
    let plain_ent = log_p
        .exp()
        .unwrap()
        .mul(&log_p)
        .unwrap()
        .sum(&[1])
        .unwrap()
        .neg()
        .unwrap();
    let plain_loss = weigh(&plain_lp, &plain_ent);
    let mut outputs = grpo_xla::trace::grad(&fused_loss, &[&h, &w]).unwrap();
    outputs.extend(grpo_xla::trace::grad(&plain_loss, &[&h, &w]).unwrap());
    let refs: Vec<&Tensor> = outputs.iter().collect();
    let executable = graph.build(&refs).unwrap().compile(&client).unwrap();
    let values = [(random_weights(18), vec![6, 3]), (random_weights(15), vec![5, 3])];
    let got = common::check::run_f64(&client, &executable, &values);
    for (fused, plain) in [(&got[0], &got[2]), (&got[1], &got[3])] {
        for (x, y) in fused.iter().zip(plain) {
            assert!(
                (x - y).abs() < 1e-4 * y.abs().max(1.0),
                "custom VJP {x} vs autodiff {y}"
            );
        }
    }
}

fn random_weights(count: usize) -> Vec<f64> {
    common::random_f64(count).into_iter().map(|v| 2.0 * v).collect()
}
