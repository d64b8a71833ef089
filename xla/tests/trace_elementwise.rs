//! Elementwise, shape and reduction ops: forward values against host math
//! and gradients against finite differences.

mod common;

use common::check::{Input, check_forward, check_gradient};
use common::cpu_client;
use grpo_xla::ElementType;
use grpo_xla::trace::Tensor;

type HostFn = fn(f64) -> f64;
/// A traced unary op.
type UnaryOp = fn(&Tensor) -> grpo_xla::Result<Tensor>;
/// A traced binary op.
type BinaryOp = fn(&Tensor, &Tensor) -> grpo_xla::Result<Tensor>;
/// (name, traced op, host op, input range).
type UnaryCase = (&'static str, UnaryOp, HostFn, f64, f64);
/// (traced op, host op, input range).
type BinaryCase = (BinaryOp, fn(f64, f64) -> f64, (f64, f64));
/// (traced op, host op on i32).
type IntegerCase = (BinaryOp, fn(i32, i32) -> i64);

#[test]
fn unary_ops_match_host_math_and_finite_differences() {
    let client = cpu_client(1);
    let logistic: HostFn = |x| 1.0 / (1.0 + (-x).exp());
    let cases: Vec<UnaryCase> = vec![
        ("neg", |t| t.neg(), |x| -x, -1.0, 1.0),
        ("exp", |t| t.exp(), f64::exp, -1.0, 1.0),
        ("log", |t| t.log(), f64::ln, 0.5, 2.0),
        ("log1p", |t| t.log1p(), f64::ln_1p, -0.5, 1.0),
        ("tanh", |t| t.tanh(), f64::tanh, -2.0, 2.0),
        ("logistic", |t| t.logistic(), logistic, -3.0, 3.0),
        ("sqrt", |t| t.sqrt(), f64::sqrt, 0.5, 2.0),
        ("rsqrt", |t| t.rsqrt(), |x| 1.0 / x.sqrt(), 0.5, 2.0),
        ("abs", |t| t.abs(), f64::abs, 0.1, 1.0),
        ("sin", |t| t.sin(), f64::sin, -3.0, 3.0),
        ("cos", |t| t.cos(), f64::cos, -3.0, 3.0),
        ("square", |t| t.square(), |x| x * x, -2.0, 2.0),
    ];
    for (name, op, host, low, high) in cases {
        for dims in [&[5][..], &[2, 3]] {
            let input = [Input::range(dims, low, high)];
            check_forward(
                &client,
                &input,
                |p| op(&p[0]),
                |v| v[0].iter().map(|&x| host(x)).collect(),
                1e-12,
            );
            check_gradient(&client, &input, |p| op(&p[0]));
        }
        println!("{name} ok");
    }
    // abs at negative values, sign and floor forward.
    let negative = [Input::range(&[4], -2.0, -0.1)];
    check_gradient(&client, &negative, |p| p[0].abs());
    check_forward(
        &client,
        &[Input::new(&[6])],
        |p| p[0].sign(),
        |v| v[0].iter().map(|x| x.signum()).collect(),
        0.0,
    );
    check_forward(
        &client,
        &[Input::range(&[6], -3.0, 3.0)],
        |p| p[0].floor(),
        |v| v[0].iter().map(|x| x.floor()).collect(),
        0.0,
    );
}

#[test]
fn binary_ops_broadcast_like_numpy() {
    let client = cpu_client(1);
    let cases: Vec<BinaryCase> = vec![
        (|a, b| a.add(b), |x, y| x + y, (-1.0, 1.0)),
        (|a, b| a.sub(b), |x, y| x - y, (-1.0, 1.0)),
        (|a, b| a.mul(b), |x, y| x * y, (-1.0, 1.0)),
        (|a, b| a.div(b), |x, y| x / y, (0.5, 2.0)),
        (|a, b| a.maximum(b), f64::max, (-1.0, 1.0)),
        (|a, b| a.minimum(b), f64::min, (-1.0, 1.0)),
        (|a, b| a.pow(b), f64::powf, (0.5, 2.0)),
    ];
    // (lhs dims, rhs dims, result dims) with numpy broadcasting.
    let shapes: [(&[i64], &[i64]); 3] = [(&[2, 3], &[2, 3]), (&[2, 3], &[3]), (&[4, 1], &[1, 3])];
    for (op, host, (low, high)) in cases {
        for (a, b) in shapes {
            let inputs = [Input::range(a, low, high), Input::range(b, low, high)];
            let (ra, rb) = (a.to_vec(), b.to_vec());
            check_forward(
                &client,
                &inputs,
                |p| op(&p[0], &p[1]),
                move |v| broadcast_binary(&v[0], &ra, &v[1], &rb, host),
                1e-12,
            );
            check_gradient(&client, &inputs, |p| op(&p[0], &p[1]));
        }
    }
}

/// Host numpy-style broadcasting of two row-major arrays (rank ≤ 2).
fn broadcast_binary(a: &[f64], ad: &[i64], b: &[f64], bd: &[i64], f: fn(f64, f64) -> f64) -> Vec<f64> {
    let pad = |d: &[i64]| -> [i64; 2] { if d.len() == 1 { [1, d[0]] } else { [d[0], d[1]] } };
    let (pa, pb) = (pad(ad), pad(bd));
    let rows = pa[0].max(pb[0]);
    let cols = pa[1].max(pb[1]);
    let at = |x: &[f64], p: [i64; 2], r: i64, c: i64| x[((r % p[0]) * p[1] + (c % p[1])) as usize];
    (0..rows)
        .flat_map(|r| (0..cols).map(move |c| (r, c)))
        .map(|(r, c)| f(at(a, pa, r, c), at(b, pb, r, c)))
        .collect()
}

#[test]
fn select_compare_and_convert() {
    let client = cpu_client(1);
    let inputs = [Input::new(&[3, 4]), Input::new(&[3, 4])];
    check_forward(
        &client,
        &inputs,
        |p| p[0].gt(&p[1])?.select(&p[0], &p[1]),
        |v| v[0].iter().zip(&v[1]).map(|(a, b)| a.max(*b)).collect(),
        0.0,
    );
    check_gradient(&client, &inputs, |p| {
        p[0].lt(&p[1])?.select(&p[0].exp()?, &p[1].square()?)
    });
    // f64 → f32 → f64 rounds to f32; the gradient passes straight through.
    check_forward(
        &client,
        &[Input::new(&[5])],
        |p| {
            p[0].convert(grpo_xla::ElementType::F32)?
                .convert(grpo_xla::ElementType::F64)
        },
        |v| v[0].iter().map(|&x| f64::from(x as f32)).collect(),
        0.0,
    );
    // Through f32 the cotangent comes back converted: d/dx sum(3·f32(x)) = 3.
    let graph = grpo_xla::trace::Graph::new("convert_grad");
    let x = graph.parameter(grpo_xla::ElementType::F64, &[5]).unwrap();
    let loss = x
        .convert(grpo_xla::ElementType::F32)
        .and_then(|y| y.mul_scalar(3.0))
        .and_then(|y| y.convert(grpo_xla::ElementType::F64))
        .and_then(|y| y.sum_all())
        .unwrap();
    let dx = grpo_xla::trace::grad(&loss, &[&x]).unwrap().remove(0);
    let executable = graph.build(&[&dx]).unwrap().compile(&client).unwrap();
    let got = common::check::run_f64(&client, &executable, &[(vec![0.3, -0.7, 1.5, 2.0, -4.0], vec![5])]);
    assert_eq!(got[0], [3.0; 5]);
}

#[test]
fn shape_ops_forward_and_gradients() {
    let client = cpu_client(1);
    let x = [Input::new(&[2, 3, 4])];
    // transpose (1, 2, 0): out[j][k][i] = x[i][j][k]
    check_forward(
        &client,
        &x,
        |p| p[0].transpose(&[1, 2, 0]),
        |v| {
            let mut out = Vec::new();
            for j in 0..3 {
                for k in 0..4 {
                    for i in 0..2 {
                        out.push(v[0][i * 12 + j * 4 + k]);
                    }
                }
            }
            out
        },
        0.0,
    );
    check_gradient(&client, &x, |p| p[0].transpose(&[1, 2, 0]));
    check_gradient(&client, &x, |p| p[0].reshape(&[6, 4]));
    check_forward(&client, &x, |p| p[0].reshape(&[24]), |v| v[0].clone(), 0.0);
    // broadcast_in_dim with a stretched and a new dimension
    check_gradient(&client, &[Input::new(&[3, 1])], |p| {
        p[0].broadcast_in_dim(&[2, 3, 5], &[1, 2])
    });
    check_forward(
        &client,
        &[Input::new(&[3])],
        |p| p[0].broadcast_in_dim(&[3, 2], &[0]),
        |v| v[0].iter().flat_map(|&a| [a, a]).collect(),
        0.0,
    );
    // strided slice
    check_forward(
        &client,
        &[Input::new(&[7])],
        |p| p[0].slice(&[1], &[7], &[2]),
        |v| vec![v[0][1], v[0][3], v[0][5]],
        0.0,
    );
    check_gradient(&client, &x, |p| p[0].slice(&[0, 1, 1], &[2, 3, 4], &[1, 1, 2]));
    // pad with interior padding; gradient to operand and value
    let pad_inputs = [Input::new(&[2, 3]), Input::new(&[])];
    check_gradient(&client, &pad_inputs, |p| p[0].pad(&p[1], &[1, 0], &[0, 2], &[1, 1]));
    check_forward(
        &client,
        &[Input::new(&[3]), Input::new(&[])],
        |p| p[0].pad(&p[1], &[1], &[1], &[1]),
        |v| vec![v[1][0], v[0][0], v[1][0], v[0][1], v[1][0], v[0][2], v[1][0]],
        0.0,
    );
    // concatenate and reverse
    let two = [Input::new(&[2, 3]), Input::new(&[2, 2])];
    check_gradient(&client, &two, |p| Tensor::concatenate(&[&p[0], &p[1]], 1));
    check_forward(
        &client,
        &[Input::new(&[4])],
        |p| p[0].reverse(&[0]),
        |v| v[0].iter().rev().copied().collect(),
        0.0,
    );
    check_gradient(&client, &x, |p| p[0].reverse(&[0, 2]));
}

#[test]
fn dynamic_slices_forward_and_gradients() {
    let client = cpu_client(1);
    let x = [Input::new(&[4, 5])];
    let start = |p: &Tensor, v: i64| p.graph().constant(&[v as i32], &[]).unwrap().reshape(&[]);
    check_forward(
        &client,
        &x,
        |p| p[0].dynamic_slice(&[&start(&p[0], 1)?, &start(&p[0], 2)?], &[2, 3]),
        |v| vec![v[0][7], v[0][8], v[0][9], v[0][12], v[0][13], v[0][14]],
        0.0,
    );
    check_gradient(&client, &x, |p| {
        p[0].dynamic_slice(&[&start(&p[0], 1)?, &start(&p[0], 2)?], &[2, 3])
    });
    let with_update = [Input::new(&[4, 5]), Input::new(&[2, 2])];
    check_gradient(&client, &with_update, |p| {
        p[0].dynamic_update_slice(&p[1], &[&start(&p[0], 2)?, &start(&p[0], 0)?])
    });
}

#[test]
fn reductions_forward_and_gradients() {
    let client = cpu_client(1);
    let x = [Input::new(&[3, 4, 2])];
    check_forward(
        &client,
        &x,
        |p| p[0].sum(&[0, 2]),
        |v| {
            (0..4)
                .map(|j| {
                    (0..3)
                        .flat_map(|i| (0..2).map(move |k| (i, k)))
                        .map(|(i, k)| v[0][i * 8 + j * 2 + k])
                        .sum()
                })
                .collect()
        },
        1e-12,
    );
    check_forward(
        &client,
        &x,
        |p| p[0].max(&[1]),
        |v| {
            (0..3)
                .flat_map(|i| (0..2).map(move |k| (i, k)))
                .map(|(i, k)| (0..4).map(|j| v[0][i * 8 + j * 2 + k]).fold(f64::MIN, f64::max))
                .collect()
        },
        0.0,
    );
    check_gradient(&client, &x, |p| p[0].sum(&[0, 2]));
    check_gradient(&client, &x, |p| p[0].max(&[1]));
    check_gradient(&client, &x, |p| p[0].min(&[0, 1, 2]));
    check_gradient(&client, &x, |p| p[0].mean(&[2]));
    check_gradient(&client, &x, |p| p[0].sum_keepdims(&[1]));
}

/// An i32 constant in the graph of `anchor`.
fn ints(anchor: &Tensor, values: &[i32]) -> grpo_xla::Result<Tensor> {
    anchor.graph().constant(values, &[values.len() as i64])
}

#[test]
fn integer_bitwise_and_compare_ops_forward() {
    let client = cpu_client(1);
    let a: [i32; 6] = [5, -3, 12, 7, 0, -8];
    let b: [i32; 6] = [3, 3, 10, 7, 1, -8];
    let cases: [IntegerCase; 11] = [
        (|x, y| x.and(y), |x, y| i64::from(x & y)),
        (|x, y| x.or(y), |x, y| i64::from(x | y)),
        (|x, y| x.xor(y), |x, y| i64::from(x ^ y)),
        (
            |x, y| x.abs()?.shift_left(&y.abs()?),
            |x, y| i64::from(x.abs() << y.abs()),
        ),
        (
            |x, y| x.abs()?.shift_right_logical(&y.abs()?),
            |x, y| i64::from(x.abs() >> y.abs()),
        ),
        (|x, y| indicator(&x.eq(y)?), |x, y| i64::from(x == y)),
        (|x, y| indicator(&x.ne(y)?), |x, y| i64::from(x != y)),
        (|x, y| indicator(&x.le(y)?), |x, y| i64::from(x <= y)),
        (|x, y| indicator(&x.ge(y)?), |x, y| i64::from(x >= y)),
        (|x, y| x.minimum(y), |x, y| i64::from(x.min(y))),
        (|x, y| x.sub(y)?.neg()?.sign(), |x, y| i64::from((y - x).signum())),
    ];
    for (op, host) in cases {
        check_forward(
            &client,
            &[Input::new(&[])],
            |p| op(&ints(&p[0], &a)?, &ints(&p[0], &b)?)?.convert(ElementType::F64),
            |_| a.iter().zip(&b).map(|(&x, &y)| host(x, y) as f64).collect(),
            0.0,
        );
    }
    // Bitcast f32 → u32 → f32 keeps the bits; 1.0f32 is 0x3F800000.
    check_forward(
        &client,
        &[Input::new(&[4])],
        |p| {
            p[0].convert(ElementType::F32)?
                .bitcast(ElementType::U32)?
                .bitcast(ElementType::F32)?
                .convert(ElementType::F64)
        },
        |v| v[0].iter().map(|&x| f64::from(x as f32)).collect(),
        0.0,
    );
    check_forward(
        &client,
        &[Input::new(&[])],
        |p| {
            p[0].graph()
                .scalar(1.0, ElementType::F32)?
                .bitcast(ElementType::U32)?
                .convert(ElementType::F64)
        },
        |_| vec![f64::from(0x3F80_0000u32)],
        0.0,
    );
}

fn indicator(pred: &Tensor) -> grpo_xla::Result<Tensor> {
    let g = pred.graph();
    let one = g.full(1.0, ElementType::S32, pred.dims())?;
    pred.select(&one, &one.zeros_like()?)
}

#[test]
fn iota_concatenate_and_dynamic_update_forward() {
    let client = cpu_client(1);
    check_forward(
        &client,
        &[Input::new(&[])],
        |p| p[0].graph().iota(ElementType::F64, &[2, 3], 1),
        |_| vec![0.0, 1.0, 2.0, 0.0, 1.0, 2.0],
        0.0,
    );
    check_forward(
        &client,
        &[Input::new(&[2, 1]), Input::new(&[2, 2])],
        |p| Tensor::concatenate(&[&p[0], &p[1]], 1),
        |v| vec![v[0][0], v[1][0], v[1][1], v[0][1], v[1][2], v[1][3]],
        0.0,
    );
    check_forward(
        &client,
        &[Input::new(&[5]), Input::new(&[2])],
        |p| {
            let start = p[0].graph().constant(&[2i32], &[1])?.reshape(&[])?;
            p[0].dynamic_update_slice(&p[1], &[&start])
        },
        |v| vec![v[0][0], v[0][1], v[1][0], v[1][1], v[0][4]],
        0.0,
    );
    // Starts out of range are clamped, as in XLA.
    check_forward(
        &client,
        &[Input::new(&[5])],
        |p| {
            let start = p[0].graph().constant(&[9i32], &[1])?.reshape(&[])?;
            p[0].dynamic_slice(&[&start], &[2])
        },
        |v| vec![v[0][3], v[0][4]],
        0.0,
    );
    check_forward(
        &client,
        &[Input::new(&[3, 4])],
        |p| p[0].min(&[1]),
        |v| {
            v[0].chunks(4)
                .map(|r| r.iter().copied().fold(f64::MAX, f64::min))
                .collect()
        },
        0.0,
    );
    check_forward(
        &client,
        &[Input::new(&[3, 4])],
        |p| p[0].mean(&[0]),
        |v| (0..4).map(|j| (v[0][j] + v[0][4 + j] + v[0][8 + j]) / 3.0).collect(),
        1e-12,
    );
}
