//! The sparse MLP against host f64 math: routing (softmax, top-k,
//! renormalized weights) and the experts' weighted SwiGLU, by the grouped
//! product and by the dense one, on balanced routing and on routing that
//! sends every token to the same two experts (a group as large as the
//! batch: no token may be dropped). The grouped product's gradients equal
//! the dense product's.

mod common;

use common::cpu_client;
use grpo_model::moe::{ExpertProduct, ExpertWeights, route, sparse_mlp};
use grpo_xla::ElementType;
use grpo_xla::trace::{Graph, Tensor, grad};

const TOKENS: usize = 37;
const HIDDEN: usize = 6;
const INNER: usize = 5;
const EXPERTS: usize = 4;
const TOP_K: usize = 2;

/// Deterministic values in [-1, 1).
fn values(count: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..count)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

struct Case {
    x: Vec<f32>,
    router: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
}

impl Case {
    fn new(skewed: bool) -> Case {
        let mut router = values(EXPERTS * HIDDEN, 2);
        if skewed {
            // Every token's features are positive and experts 2 and 3 weigh them most.
            for (e, row) in router.chunks_mut(HIDDEN).enumerate() {
                row.iter_mut()
                    .for_each(|w| *w = 0.1 * *w + if e >= 2 { 2.0 + e as f32 } else { 0.0 });
            }
        }
        let mut x = values(TOKENS * HIDDEN, 1);
        if skewed {
            x.iter_mut().for_each(|v| *v = v.abs() + 0.5);
        }
        Case {
            x,
            router,
            gate: values(EXPERTS * INNER * HIDDEN, 3),
            up: values(EXPERTS * INNER * HIDDEN, 4),
            down: values(EXPERTS * HIDDEN * INNER, 5),
        }
    }

    /// The layer's output in f64, and the experts each token chose.
    fn reference(&self) -> (Vec<f64>, Vec<Vec<usize>>) {
        let f = |v: f32| f64::from(v);
        let mut out = vec![0.0; TOKENS * HIDDEN];
        let mut chosen = Vec::new();
        for t in 0..TOKENS {
            let x = &self.x[t * HIDDEN..(t + 1) * HIDDEN];
            let logits: Vec<f64> = (0..EXPERTS)
                .map(|e| (0..HIDDEN).map(|h| f(x[h]) * f(self.router[e * HIDDEN + h])).sum())
                .collect();
            let top = logits.iter().cloned().fold(f64::MIN, f64::max);
            let total: f64 = logits.iter().map(|l| (l - top).exp()).sum();
            let probs: Vec<f64> = logits.iter().map(|l| (l - top).exp() / total).collect();
            let mut order: Vec<usize> = (0..EXPERTS).collect();
            order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
            let picked = &order[..TOP_K];
            let norm: f64 = picked.iter().map(|&e| probs[e]).sum();
            for &e in picked {
                let inner: Vec<f64> = (0..INNER)
                    .map(|i| {
                        let row = (e * INNER + i) * HIDDEN;
                        let g: f64 = (0..HIDDEN).map(|h| f(x[h]) * f(self.gate[row + h])).sum();
                        let u: f64 = (0..HIDDEN).map(|h| f(x[h]) * f(self.up[row + h])).sum();
                        g / (1.0 + (-g).exp()) * u
                    })
                    .collect();
                for h in 0..HIDDEN {
                    let row = (e * HIDDEN + h) * INNER;
                    let y: f64 = (0..INNER).map(|i| inner[i] * f(self.down[row + i])).sum();
                    out[t * HIDDEN + h] += probs[e] / norm * y;
                }
            }
            chosen.push(picked.to_vec());
        }
        (out, chosen)
    }
}

/// Runs the layer by `product`: output, chosen experts, and the gradients
/// of `Σ out²/2` with respect to the tokens, the router and the experts.
fn run(case: &Case, product: ExpertProduct) -> (Vec<f32>, Vec<i32>, Vec<Vec<f32>>) {
    let graph = Graph::new("moe");
    let dims: [&[i64]; 5] = [
        &[TOKENS as i64, HIDDEN as i64],
        &[EXPERTS as i64, HIDDEN as i64],
        &[EXPERTS as i64, INNER as i64, HIDDEN as i64],
        &[EXPERTS as i64, INNER as i64, HIDDEN as i64],
        &[EXPERTS as i64, HIDDEN as i64, INNER as i64],
    ];
    let params: Vec<Tensor> = dims
        .iter()
        .map(|d| graph.parameter(ElementType::F32, d).unwrap())
        .collect();
    let routing = route(&params[0], &params[1], TOP_K, true).unwrap();
    let weights = ExpertWeights {
        gate: &params[2],
        up: &params[3],
        down: &params[4],
    };
    let out = sparse_mlp(&params[0], &routing, &weights, product).unwrap();
    let loss = out.square().unwrap().sum_all().unwrap().mul_scalar(0.5).unwrap();
    let grads = grad(&loss, &params.iter().collect::<Vec<_>>()).unwrap();
    let mut outputs = vec![&out, &routing.experts];
    outputs.extend(grads.iter());
    let client = cpu_client();
    let program = graph.build(&outputs).unwrap().compile(&client).unwrap();
    let device = client.device(0).unwrap();
    let data = [&case.x, &case.router, &case.gate, &case.up, &case.down];
    let buffers: Vec<_> = data
        .iter()
        .zip(dims)
        .map(|(v, d)| client.buffer_from_host(v.as_slice(), d, device).unwrap())
        .collect();
    let out = program.execute(&buffers.iter().collect::<Vec<_>>()).unwrap();
    let grads = out[2..].iter().map(|b| b.to_host::<f32>().unwrap()).collect();
    (
        out[0].to_host::<f32>().unwrap(),
        out[1].to_host::<i32>().unwrap(),
        grads,
    )
}

fn check(skewed: bool) {
    let case = Case::new(skewed);
    let (want, chosen) = case.reference();
    if skewed {
        assert!(
            chosen.iter().all(|c| c == &[3, 2]),
            "every token goes to experts 3 and 2"
        );
    }
    let mut runs = Vec::new();
    for product in [ExpertProduct::Grouped, ExpertProduct::Dense] {
        let (got, experts, grads) = run(&case, product);
        let picked: Vec<Vec<usize>> = experts
            .chunks(TOP_K)
            .map(|c| c.iter().map(|&e| e as usize).collect())
            .collect();
        assert_eq!(picked, chosen, "{product:?} routing");
        let worst = got
            .iter()
            .zip(&want)
            .map(|(g, w)| (f64::from(*g) - w).abs())
            .fold(0.0, f64::max);
        let scale = want.iter().map(|w| w.abs()).fold(0.0, f64::max);
        assert!(scale > 0.1, "the layer's output is not negligible");
        assert!(worst <= 1e-5 * scale.max(1.0), "{product:?}: |out − f64| up to {worst}");
        runs.push(grads);
    }
    for (k, (grouped, dense)) in runs[0].iter().zip(&runs[1]).enumerate() {
        let scale = dense.iter().map(|v| v.abs()).fold(0.0f32, f32::max);
        let worst = grouped
            .iter()
            .zip(dense)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(scale > 0.0, "input {k} gets a gradient");
        assert!(
            worst <= 1e-5 * scale.max(1.0),
            "input {k}: grouped and dense gradients differ by {worst}"
        );
    }
}

#[test]
fn balanced_routing_matches_host_math() {
    check(false);
}

#[test]
fn one_expert_pair_takes_every_token_and_drops_none() {
    check(true);
}
