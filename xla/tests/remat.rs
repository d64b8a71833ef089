//! Rematerialization (activation checkpointing): a stack of blocks each run
//! through `rematerialized` gives the gradients plain autodiff gives, and
//! the compiled program holds less memory — the barrier keeps XLA from
//! merging the recomputation back into the forward pass.

mod common;

use common::cpu_client;
use grpo_xla::trace::{Graph, Tensor, grad, optimization_barrier, rematerialized};
use grpo_xla::{Client, ElementType, Executable};

const ROWS: i64 = 256;
const WIDTH: i64 = 64;
const HIDDEN: i64 = 1024;
const BLOCKS: usize = 6;

/// One block: `x + tanh(x · a) · b`, whose `[ROWS, HIDDEN]` activation
/// autodiff keeps for the backward pass.
fn block(x: &Tensor, a: &Tensor, b: &Tensor) -> grpo_xla::Result<Tensor> {
    x.add(&x.matmul(a)?.tanh()?.matmul(b)?)
}

/// The gradients of `sum(stack(x)²)` with respect to `x` and every block's
/// weights, blocks rematerialized or not, compiled.
fn program(client: &Client, remat: bool) -> Executable {
    let graph = Graph::new("stack");
    let x = graph.parameter(ElementType::F32, &[ROWS, WIDTH]).unwrap();
    let weights: Vec<(Tensor, Tensor)> = (0..BLOCKS)
        .map(|_| {
            (
                graph.parameter(ElementType::F32, &[WIDTH, HIDDEN]).unwrap(),
                graph.parameter(ElementType::F32, &[HIDDEN, WIDTH]).unwrap(),
            )
        })
        .collect();
    let mut h = x.clone();
    for (a, b) in &weights {
        h = if remat {
            rematerialized("block", &[&h, a, b], |p| Ok(vec![block(&p[0], &p[1], &p[2])?]))
                .unwrap()
                .remove(0)
        } else {
            block(&h, a, b).unwrap()
        };
    }
    let loss = h.square().unwrap().sum_all().unwrap();
    let mut wrt = vec![&x];
    wrt.extend(weights.iter().flat_map(|(a, b)| [a, b]));
    let gradients = grad(&loss, &wrt).unwrap();
    let mut outputs = vec![&loss];
    outputs.extend(&gradients);
    let function = graph.build(&outputs).unwrap();
    let text = function.to_stablehlo().unwrap();
    assert_eq!(
        text.matches("stablehlo.optimization_barrier").count(),
        if remat { BLOCKS } else { 0 },
        "one barrier per rematerialized block"
    );
    function.compile(client).unwrap()
}

/// Random inputs of [`program`]: `x` in [−1, 1], weights in [−0.2, 0.2].
fn inputs() -> Vec<(Vec<f32>, Vec<i64>)> {
    let draw = |count: i64, scale: f64| -> Vec<f32> {
        common::random_f64(count as usize)
            .into_iter()
            .map(|v| (scale * v) as f32)
            .collect()
    };
    let mut values = vec![(draw(ROWS * WIDTH, 1.0), vec![ROWS, WIDTH])];
    for _ in 0..BLOCKS {
        values.push((draw(WIDTH * HIDDEN, 0.2), vec![WIDTH, HIDDEN]));
        values.push((draw(HIDDEN * WIDTH, 0.2), vec![HIDDEN, WIDTH]));
    }
    values
}

#[test]
fn rematerialized_blocks_give_autodiffs_gradients_and_hold_less_memory() {
    let client = cpu_client(1);
    let plain = program(&client, false);
    let remat = program(&client, true);
    let values = inputs();
    let expected = common::check::run(&client, &plain, &values);
    let got = common::check::run(&client, &remat, &values);
    for (index, (g, e)) in got.iter().zip(&expected).enumerate() {
        for (x, y) in g.iter().zip(e) {
            assert!((x - y).abs() <= 1e-5 * y.abs().max(1.0), "output {index}: {x} vs {y}");
        }
    }
    // Each plain block keeps its [ROWS, HIDDEN] tanh (1 MiB); a
    // rematerialized one keeps its [ROWS, WIDTH] input alone.
    let (plain, remat) = (plain.memory_stats().unwrap(), remat.memory_stats().unwrap());
    let activation = (ROWS * HIDDEN * 4) as usize;
    assert!(
        remat.temporaries + (BLOCKS - 2) * activation <= plain.temporaries,
        "temporaries: {} rematerialized vs {} kept",
        remat.temporaries,
        plain.temporaries
    );
}

#[test]
fn a_barrier_is_the_identity_and_passes_gradients_through() {
    let client = cpu_client(1);
    let graph = Graph::new("barrier");
    let x = graph.parameter(ElementType::F32, &[3]).unwrap();
    let y = graph.parameter(ElementType::F32, &[3]).unwrap();
    let held = optimization_barrier(&[&x, &y]).unwrap();
    let loss = held[0].mul(&held[1]).unwrap().sum_all().unwrap();
    let gradients = grad(&loss, &[&x, &y]).unwrap();
    let executable = graph
        .build(&[&held[0], &gradients[0], &gradients[1]])
        .unwrap()
        .compile(&client)
        .unwrap();
    let inputs = [(vec![1.0f32, 2.0, 3.0], vec![3]), (vec![4.0, 5.0, 6.0], vec![3])];
    let out = common::check::run(&client, &executable, &inputs);
    assert_eq!(out, [vec![1.0, 2.0, 3.0], vec![4.0, 5.0, 6.0], vec![1.0, 2.0, 3.0]]);
}
