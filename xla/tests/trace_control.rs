//! Control and sampling ops on the real CPU plugin: sort against a host
//! stable sort (and its gradient against finite differences), counted and
//! data-dependent loops against host loops, loop tracing errors, threaded
//! random bits and uniform values, and stop_gradient.

mod common;

use std::cmp::Ordering;

use common::check::{Input, check_forward, check_gradient, run_f64};
use common::{cpu_client, random_f64};
use grpo_xla::trace::{Graph, Tensor, fori_loop, grad, rng_bit_generator, uniform, while_loop};
use grpo_xla::{Buffer, Client, ElementType, Error, NativeType};

/// A device buffer of `data` with `dims`.
fn buffer<T: NativeType>(client: &Client, data: &[T], dims: &[i64]) -> Buffer {
    client.buffer_from_host(data, dims, client.device(0).unwrap()).unwrap()
}

/// Builds `graph` returning `outputs`, compiles it and runs it on `args`.
fn run(client: &Client, graph: &Graph, outputs: &[&Tensor], args: &[Buffer]) -> Vec<Buffer> {
    let executable = graph.build(outputs).unwrap().compile(client).unwrap();
    let refs: Vec<&Buffer> = args.iter().collect();
    executable.execute(&refs).unwrap()
}

/// Host order of the traced sort: stable, NaNs last in both directions.
fn host_order(a: f64, b: f64, descending: bool) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (false, false) if descending => b.partial_cmp(&a).unwrap(),
        (false, false) => a.partial_cmp(&b).unwrap(),
        (a_nan, b_nan) => a_nan.cmp(&b_nan),
    }
}

/// Stable argsort of each row of a row-major `rows × cols` array.
fn host_argsort(data: &[f64], cols: usize, descending: bool) -> Vec<i32> {
    data.chunks(cols)
        .flat_map(|row| {
            let mut index: Vec<usize> = (0..cols).collect();
            index.sort_by(|&i, &j| host_order(row[i], row[j], descending));
            index.into_iter().map(|i| i as i32)
        })
        .collect()
}

/// Sorts a `[rows, cols]` tensor of `dtype` along its last axis on XLA;
/// returns the values (as f64) and the permutation.
fn device_sort(client: &Client, data: &[f64], rows: i64, dtype: ElementType, descending: bool) -> (Vec<f64>, Vec<i32>) {
    let cols = data.len() as i64 / rows;
    let graph = Graph::new("sort");
    let x = graph.parameter(ElementType::F64, &[rows, cols]).unwrap();
    let (values, indices) = x.convert(dtype).unwrap().sort(1, descending).unwrap();
    let values = values.convert(ElementType::F64).unwrap();
    let function = graph.build(&[&values, &indices]).unwrap();
    let text = function.to_stablehlo().unwrap();
    assert!(
        text.contains("\"stablehlo.sort\"") && text.contains("is_stable = true"),
        "{text}"
    );
    let arg = buffer(client, data, &[rows, cols]);
    let out = function.compile(client).unwrap().execute(&[&arg]).unwrap();
    (out[0].to_host::<f64>().unwrap(), out[1].to_host::<i32>().unwrap())
}

#[test]
fn sort_matches_a_host_stable_sort() {
    let client = cpu_client(1);
    let random = random_f64(3 * 7);
    // Few distinct values: many ties, whose order must be kept.
    let ties: Vec<f64> = random.iter().map(|x| (x * 2.0).round()).collect();
    let nan = vec![1.0, f64::NAN, -2.0, 3.0, f64::NAN, 0.0, -0.5];
    let cases = [
        (&random, 3, ElementType::F64),
        (&ties, 3, ElementType::F32),
        (&ties, 3, ElementType::S32),
        (&nan, 1, ElementType::F32),
    ];
    for (data, rows, dtype) in cases {
        let cols = data.len() / rows as usize;
        for descending in [false, true] {
            let (values, perm) = device_sort(&client, data, rows, dtype, descending);
            let want = host_argsort(data, cols, descending);
            assert_eq!(perm, want, "{dtype} descending={descending} on {data:?}");
            for (i, (&v, &p)) in values.iter().zip(&perm).enumerate() {
                let source = data[i / cols * cols + p as usize];
                assert!(
                    v == source || (v.is_nan() && source.is_nan()),
                    "element {i}: {v} is not input {p} = {source}"
                );
            }
        }
    }
    let error = Graph::new("g")
        .parameter(ElementType::F32, &[3])
        .unwrap()
        .sort(1, false)
        .unwrap_err()
        .to_string();
    assert!(error.starts_with("sort") && error.contains("axis 1"), "{error}");
}

#[test]
fn sort_gradient_flows_through_the_permutation() {
    let client = cpu_client(1);
    let x = [Input::new(&[3, 5])];
    check_gradient(&client, &x, |p| Ok(p[0].sort(1, true)?.0));
    check_gradient(&client, &x, |p| Ok(p[0].sort(0, false)?.0));
    // Sorted values mixed with the input itself.
    check_gradient(&client, &x, |p| p[0].sort(1, false)?.0.mul(&p[0]));
    // The permutation the VJP needs is the forward sort's own output: one
    // sort forward, one to put the cotangent back.
    let graph = Graph::new("sort_grad");
    let x = graph.parameter(ElementType::F64, &[4, 6]).unwrap();
    let loss = x.sort(1, true).unwrap().0.square().unwrap().sum_all().unwrap();
    let dx = grad(&loss, &[&x]).unwrap().remove(0);
    let text = graph.build(&[&dx]).unwrap().to_stablehlo().unwrap();
    assert_eq!(text.matches("\"stablehlo.sort\"").count(), 2, "{text}");
}

#[test]
fn fori_loop_matches_host_loops() {
    let client = cpu_client(1);
    // x · 2^5
    check_forward(
        &client,
        &[Input::new(&[4])],
        |p| Ok(fori_loop(5, &[&p[0]], |_, c| Ok(vec![c[0].mul_scalar(2.0)?]))?.remove(0)),
        |v| v[0].iter().map(|x| x * 32.0).collect(),
        0.0,
    );
    // Nested loops: x · 2^(3·4).
    check_forward(
        &client,
        &[Input::new(&[2])],
        |p| {
            let out = fori_loop(3, &[&p[0]], |_, c| {
                fori_loop(4, &[&c[0]], |_, d| Ok(vec![d[0].mul_scalar(2.0)?]))
            })?;
            Ok(out[0].clone())
        },
        |v| v[0].iter().map(|x| x * 4096.0).collect(),
        0.0,
    );
    // Zero iterations return the initial values.
    check_forward(
        &client,
        &[Input::new(&[3])],
        |p| Ok(fori_loop(0, &[&p[0]], |_, c| Ok(vec![c[0].exp()?]))?.remove(0)),
        |v| v[0].clone(),
        0.0,
    );
    // Prefix sums of a carried tensor read with dynamic_slice at the
    // counter, written back with dynamic_update_slice; plus Σ i².
    let n = 7;
    check_forward(
        &client,
        &[Input::new(&[n])],
        |p| {
            let g = p[0].graph();
            let (acc, squares) = (g.scalar(0.0, ElementType::F64)?, g.scalar(0.0, ElementType::F64)?);
            let prefix = p[0].zeros_like()?;
            let out = fori_loop(n, &[&acc, &p[0], &prefix, &squares], |i, c| {
                let piece = c[1].dynamic_slice(&[i], &[1])?.reshape(&[])?;
                let acc = c[0].add(&piece)?;
                let prefix = c[2].dynamic_update_slice(&acc.reshape(&[1])?, &[i])?;
                let squares = c[3].add(&i.convert(ElementType::F64)?.square()?)?;
                Ok(vec![acc, c[1].clone(), prefix, squares])
            })?;
            let total_and_squares = Tensor::concatenate(&[&out[0].reshape(&[1])?, &out[3].reshape(&[1])?], 0)?;
            Tensor::concatenate(&[&out[2], &total_and_squares], 0)
        },
        |v| {
            let mut sums: Vec<f64> = v[0]
                .iter()
                .scan(0.0, |s, x| {
                    *s += x;
                    Some(*s)
                })
                .collect();
            sums.push(v[0].iter().sum());
            sums.push((0..n).map(|i| (i * i) as f64).sum());
            sums
        },
        1e-12,
    );
    // Two identical loops stay two loops.
    let graph = Graph::new("twice");
    let x = graph.parameter(ElementType::F64, &[2]).unwrap();
    let double = |x: &Tensor| {
        fori_loop(3, &[x], |_, c| Ok(vec![c[0].mul_scalar(2.0)?]))
            .unwrap()
            .remove(0)
    };
    let (a, b) = (double(&x), double(&x));
    let text = graph.build(&[&a, &b]).unwrap().to_stablehlo().unwrap();
    assert_eq!(text.matches("\"stablehlo.while\"").count(), 2, "{text}");
}

/// Collatz steps of `n` on XLA: a loop whose trip count depends on the data.
fn collatz_program() -> (Graph, Tensor) {
    let graph = Graph::new("collatz");
    let n = graph.parameter(ElementType::S32, &[]).unwrap();
    let steps = graph.scalar(0.0, ElementType::S32).unwrap();
    let out = while_loop(
        &[&n, &steps],
        |c| c[0].ne(&c[0].scalar_like(1.0)?),
        |c| {
            let (n, steps) = (&c[0], &c[1]);
            let even = n.and(&n.scalar_like(1.0)?)?.eq(&n.scalar_like(0.0)?)?;
            let half = n.div(&n.scalar_like(2.0)?)?;
            let triple = n.mul_scalar(3.0)?.add_scalar(1.0)?;
            Ok(vec![even.select(&half, &triple)?, steps.add_scalar(1.0)?])
        },
    )
    .unwrap();
    (graph, out[1].clone())
}

#[test]
fn while_loop_with_a_data_dependent_condition() {
    let client = cpu_client(1);
    let (graph, steps) = collatz_program();
    let executable = graph.build(&[&steps]).unwrap().compile(&client).unwrap();
    for start in [1, 6, 7, 27, 97] {
        let mut n: i32 = start;
        let mut want = 0;
        while n != 1 {
            n = if n % 2 == 0 { n / 2 } else { 3 * n + 1 };
            want += 1;
        }
        let arg = buffer(&client, &[start], &[]);
        let got = executable.execute(&[&arg]).unwrap()[0].to_host::<i32>().unwrap();
        assert_eq!(got, [want], "collatz steps of {start}");
    }
    // Halve x until it drops below a threshold carried in from outside.
    let graph = Graph::new("halve");
    let x = graph.parameter(ElementType::F64, &[]).unwrap();
    let threshold = graph.parameter(ElementType::F64, &[]).unwrap();
    let out = while_loop(
        &[&x, &threshold],
        |c| c[0].ge(&c[1]),
        |c| Ok(vec![c[0].mul_scalar(0.5)?, c[1].clone()]),
    )
    .unwrap();
    let executable = graph.build(&[&out[0]]).unwrap().compile(&client).unwrap();
    for (x, t) in [(100.0, 3.0), (0.5, 1.0), (1.0, 1e-3)] {
        let mut want = x;
        while want >= t {
            want *= 0.5;
        }
        let got = run_f64(&client, &executable, &[(vec![x], vec![]), (vec![t], vec![])]);
        assert_eq!(got[0], [want], "halving {x} below {t}");
    }
}

/// The error of `while_loop` over an `f64[3]` parameter of graph `outer`
/// with `body` (and a `x < 0` condition), given the outer `x`.
fn loop_error(body: impl FnOnce(&[Tensor], &Tensor) -> grpo_xla::Result<Vec<Tensor>>) -> String {
    let graph = Graph::new("outer");
    let x = graph.parameter(ElementType::F64, &[3]).unwrap();
    let y = graph.parameter(ElementType::F64, &[3]).unwrap();
    let cond = |c: &[Tensor]| c[0].sum_all()?.lt(&c[0].scalar_like(0.0)?);
    while_loop(&[&y], cond, |c| body(c, &x)).unwrap_err().to_string()
}

#[test]
fn loop_tracing_errors_name_the_problem() {
    // A tensor of the enclosing graph used inside the body.
    let error = loop_error(|c, x| Ok(vec![c[0].add(x)?]));
    assert!(
        error.contains("`outer`") && error.contains("`outer/while_body`") && error.contains("parameter"),
        "{error}"
    );
    // … or returned from it.
    let error = loop_error(|_, x| Ok(vec![x.clone()]));
    assert!(
        error.starts_with("while") && error.contains("carry outer tensors in `init`"),
        "{error}"
    );
    // Wrong types and counts.
    let error = loop_error(|c, _| Ok(vec![c[0].convert(ElementType::F32)?]));
    assert!(
        error.starts_with("while") && error.contains("output 0 is f32[3], not f64[3]"),
        "{error}"
    );
    let error = loop_error(|c, _| Ok(vec![c[0].clone(), c[0].clone()]));
    assert!(error.contains("2 values instead of 1"), "{error}");
    // The condition must be a pred scalar.
    let graph = Graph::new("outer");
    let y = graph.parameter(ElementType::F64, &[3]).unwrap();
    let error = while_loop(&[&y], |c| c[0].sum_all(), |c| Ok(c.to_vec()))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("`outer/while_cond` must return (pred[])") && error.contains("f64[]"),
        "{error}"
    );
    // A foreign tensor in the condition.
    let other = Graph::new("other").parameter(ElementType::F64, &[]).unwrap();
    let error = while_loop(&[&y], |c| c[0].sum_all()?.lt(&other), |c| Ok(c.to_vec()))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("`other`") && error.contains("`outer/while_cond`"),
        "{error}"
    );
    // fori_loop names mismatches in the caller's own indices.
    let n = graph.scalar(0.0, ElementType::S32).unwrap();
    let error = fori_loop(2, &[&y, &n], |_, c| Ok(vec![c[0].clone(), c[0].sum_all()?]))
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with("fori_loop") && error.contains("output 1 is f64[], not s32[]"),
        "{error}"
    );
    let error = fori_loop(-1, &[&y], |_, c| Ok(c.to_vec())).unwrap_err().to_string();
    assert!(error.starts_with("fori_loop") && error.contains("-1"), "{error}");
    // A body tensor smuggled out cannot take more ops.
    let mut leaked = None;
    fori_loop(1, &[&y], |_, c| {
        leaked = Some(c[0].clone());
        Ok(c.to_vec())
    })
    .unwrap();
    let error = leaked.unwrap().exp().unwrap_err().to_string();
    assert!(error.contains("already built"), "{error}");
}

#[test]
fn no_gradient_through_while() {
    let graph = Graph::new("loop_grad");
    let x = graph.parameter(ElementType::F64, &[3]).unwrap();
    let out = fori_loop(3, &[&x], |_, c| Ok(vec![c[0].mul_scalar(2.0)?])).unwrap();
    let loss = out[0].sum_all().unwrap();
    let error = grad(&loss, &[&x]).unwrap_err();
    assert!(matches!(error, Error::NoGradient { op: "while" }), "{error:?}");
    assert!(error.to_string().contains("`while`"), "{error}");

    // As the error advises, stop_gradient on the loop's input lets grad through the rest.
    let graph = Graph::new("loop_stopped");
    let x = graph.parameter(ElementType::F64, &[3]).unwrap();
    let looped = fori_loop(3, &[&x.stop_gradient().unwrap()], |_, c| {
        Ok(vec![c[0].mul_scalar(2.0)?])
    })
    .unwrap();
    let loss = x.mul(&looped[0]).unwrap().sum_all().unwrap();
    let dx = grad(&loss, &[&x]).unwrap().remove(0);
    let client = cpu_client(1);
    let executable = graph.build(&[&dx]).unwrap().compile(&client).unwrap();
    let values = random_f64(3);
    let got = run_f64(&client, &executable, &[(values.clone(), vec![3])]);
    let want: Vec<f64> = values.iter().map(|v| 8.0 * v).collect();
    assert_eq!(got[0], want, "d/dx Σ x·stop(8x) = 8x");
}

#[test]
fn stop_gradient_is_identity_without_gradient() {
    let client = cpu_client(1);
    let graph = Graph::new("stop");
    let x = graph.parameter(ElementType::F64, &[5]).unwrap();
    let loss = x.mul(&x.stop_gradient().unwrap()).unwrap().sum_all().unwrap();
    let dx = grad(&loss, &[&x]).unwrap().remove(0);
    let function = graph.build(&[&loss, &dx]).unwrap();
    let executable = function.compile(&client).unwrap();
    let values = random_f64(5);
    let got = run_f64(&client, &executable, &[(values.clone(), vec![5])]);
    let sum_of_squares: f64 = values.iter().map(|v| v * v).sum();
    assert!(
        (got[0][0] - sum_of_squares).abs() <= 1e-12,
        "loss {} vs {sum_of_squares}",
        got[0][0]
    );
    // x, not 2x: no gradient reached x through stop_gradient.
    assert_eq!(got[1], values);
}

/// Runs two successive draws from a `u64[2]` state of `seed`: the next
/// state, the first bits and the second bits.
fn draws(client: &Client, seed: u64, count: i64) -> (Vec<u64>, Vec<u32>, Vec<u32>) {
    let graph = Graph::new("rng");
    let state = graph.parameter(ElementType::U64, &[2]).unwrap();
    let (next, first) = rng_bit_generator(&state, &[count]).unwrap();
    let (_, second) = rng_bit_generator(&next, &[count]).unwrap();
    let out = run(
        client,
        &graph,
        &[&next, &first, &second],
        &[buffer(client, &[seed, 0u64], &[2])],
    );
    (
        out[0].to_host().unwrap(),
        out[1].to_host().unwrap(),
        out[2].to_host().unwrap(),
    )
}

#[test]
fn rng_bits_are_deterministic_and_threaded() {
    let client = cpu_client(1);
    let (state, first, second) = draws(&client, 42, 1024);
    assert_eq!(draws(&client, 42, 1024), (state.clone(), first.clone(), second.clone()));
    assert_ne!(state, [42, 0], "the state must advance");
    assert_ne!(first, second, "successive draws must differ");
    assert_ne!(draws(&client, 43, 1024).1, first, "another seed, other bits");
    // Bits look random: about half of all bits are set.
    let ones: u32 = first.iter().map(|b| b.count_ones()).sum();
    assert!((ones as f64 / (1024.0 * 32.0) - 0.5).abs() < 0.02, "{ones} ones");

    let graph = Graph::new("rng");
    let state = graph.parameter(ElementType::U64, &[2]).unwrap();
    let (_, bits) = rng_bit_generator(&state, &[2, 3]).unwrap();
    let text = graph.build(&[&bits]).unwrap().to_stablehlo().unwrap();
    assert!(
        text.contains("rng_algorithm THREE_FRY") && text.contains("-> (tensor<2xui64>, tensor<2x3xui32>)"),
        "{text}"
    );
    let bad = Graph::new("g").parameter(ElementType::U32, &[4]).unwrap();
    let error = rng_bit_generator(&bad, &[2]).unwrap_err().to_string();
    assert!(
        error.starts_with("rng_bit_generator") && error.contains("u64[2]"),
        "{error}"
    );
    let error = uniform(&state, &[2], ElementType::S32).unwrap_err().to_string();
    assert!(error.starts_with("uniform") && error.contains("s32"), "{error}");
}

#[test]
fn uniform_values_are_in_unit_interval_with_uniform_moments() {
    let client = cpu_client(1);
    let count = 65536;
    for dtype in [ElementType::F64, ElementType::F32, ElementType::Bf16] {
        let graph = Graph::new("uniform");
        let state = graph.parameter(ElementType::U64, &[2]).unwrap();
        let (next, first) = uniform(&state, &[count], dtype).unwrap();
        let (_, second) = uniform(&next, &[count], dtype).unwrap();
        let widen = |t: &Tensor| t.convert(ElementType::F64).unwrap();
        let (first, second) = (widen(&first), widen(&second));
        let out = run(
            &client,
            &graph,
            &[&first, &second],
            &[buffer(&client, &[7u64, 11], &[2])],
        );
        let first = out[0].to_host::<f64>().unwrap();
        let second = out[1].to_host::<f64>().unwrap();
        assert!(
            first.iter().all(|v| (0.0..1.0).contains(v)),
            "{dtype}: a value outside [0, 1)"
        );
        let n = count as f64;
        let mean = first.iter().sum::<f64>() / n;
        let variance = first.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
        assert!((mean - 0.5).abs() < 0.01, "{dtype}: mean {mean}");
        assert!((variance - 1.0 / 12.0).abs() < 0.003, "{dtype}: variance {variance}");
        assert_ne!(first, second, "{dtype}: successive draws must differ");
    }
}
