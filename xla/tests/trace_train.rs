//! Functional optimizers against host f64 math, and whole training steps
//! compiled as one program: the loss falls, one compilation, flat memory.

mod common;

use common::check::run_f64;
use common::{cpu_client, random_f64};
use grpo_xla::trace::{AdamW, Graph, Mesh, Optimizer, Sgd, Tensor, TrainStep, TrainStepSpec, clip_by_global_norm};
use grpo_xla::{Arg, Buffer, Client, ElementType, ShardedBuffer, TensorType};

/// Host AdamW in f64, the formula of `torch.optim.AdamW`.
struct HostAdamW {
    m: Vec<f64>,
    v: Vec<f64>,
    t: i32,
}

impl HostAdamW {
    fn step(&mut self, p: &mut [f64], g: &[f64], lr: f64, cfg: &AdamW) {
        self.t += 1;
        let bias1 = 1.0 - cfg.beta1.powi(self.t);
        let bias2 = 1.0 - cfg.beta2.powi(self.t);
        for i in 0..p.len() {
            p[i] -= lr * cfg.weight_decay * p[i];
            self.m[i] = cfg.beta1 * self.m[i] + (1.0 - cfg.beta1) * g[i];
            self.v[i] = cfg.beta2 * self.v[i] + (1.0 - cfg.beta2) * g[i] * g[i];
            let denom = self.v[i].sqrt() / bias2.sqrt() + cfg.eps;
            p[i] -= lr / bias1 * self.m[i] / denom;
        }
    }
}

fn f32s(values: &[f64]) -> Vec<f32> {
    values.iter().map(|&v| v as f32).collect()
}

/// A program `(params, state, grads, lr) → (params', state')` for `optimizer`.
fn update_program(client: &Client, optimizer: &dyn Optimizer, shapes: &[Vec<i64>]) -> grpo_xla::Executable {
    let graph = Graph::new("update");
    let types: Vec<TensorType> = shapes
        .iter()
        .map(|d| TensorType::new(ElementType::F32, d.clone()))
        .collect();
    let spec = optimizer.state_spec(&types);
    let params: Vec<Tensor> = types
        .iter()
        .map(|t| graph.parameter(t.dtype, &t.dims).unwrap())
        .collect();
    let state: Vec<Tensor> = spec
        .iter()
        .map(|(_, t)| graph.parameter(t.dtype, &t.dims).unwrap())
        .collect();
    let grads: Vec<Tensor> = types
        .iter()
        .map(|t| graph.parameter(t.dtype, &t.dims).unwrap())
        .collect();
    let lr = graph.parameter(ElementType::F32, &[]).unwrap();
    let (new_params, new_state) = optimizer.update(&params, &grads, &state, &lr).unwrap();
    let outputs: Vec<&Tensor> = new_params.iter().chain(&new_state).collect();
    let donated = params.len() + state.len();
    graph
        .build(&outputs)
        .unwrap()
        .donate_range(0..donated)
        .unwrap()
        .compile(client)
        .unwrap()
}

#[test]
fn adamw_matches_host_f64_for_ten_steps() {
    let client = cpu_client(1);
    let device = client.device(0).unwrap();
    let cfg = AdamW::default();
    let shapes = vec![vec![4, 3], vec![5]];
    let executable = update_program(&client, &cfg, &shapes);
    let mut host_params: Vec<Vec<f64>> = shapes
        .iter()
        .map(|d| random_f64(d.iter().product::<i64>() as usize))
        .collect();
    // The device starts from the f32-rounded values; the host follows them exactly.
    for p in &mut host_params {
        *p = f32s(p).iter().map(|&v| f64::from(v)).collect();
    }
    let mut host: Vec<HostAdamW> = host_params
        .iter()
        .map(|p| HostAdamW {
            m: vec![0.0; p.len()],
            v: vec![0.0; p.len()],
            t: 0,
        })
        .collect();
    let upload = |values: &[f32], dims: &[i64]| client.buffer_from_host(values, dims, device).unwrap();
    let mut params: Vec<Buffer> = host_params
        .iter()
        .zip(&shapes)
        .map(|(p, d)| upload(&f32s(p), d))
        .collect();
    let state_spec = cfg.state_spec(
        &shapes
            .iter()
            .map(|d| TensorType::new(ElementType::F32, d.clone()))
            .collect::<Vec<_>>(),
    );
    let mut state: Vec<Buffer> = state_spec
        .iter()
        .map(|(_, t)| upload(&vec![0.0; t.element_count()], &t.dims))
        .collect();
    for step in 0..10 {
        let lr = 1e-2 * (1.0 + step as f64) / 10.0; // a schedule: changes every step, never recompiles
        let grads: Vec<Vec<f32>> = host_params.iter().map(|p| f32s(&random_f64(p.len()))).collect();
        for ((p, g), h) in host_params.iter_mut().zip(&grads).zip(&mut host) {
            let g64: Vec<f64> = g.iter().map(|&v| f64::from(v)).collect();
            h.step(p, &g64, f64::from(lr as f32), &cfg);
        }
        let grad_buffers: Vec<Buffer> = grads.iter().zip(&shapes).map(|(g, d)| upload(g, d)).collect();
        let lr_buffer = upload(&[lr as f32], &[]);
        let mut args: Vec<Arg<'_>> = params.iter().map(Arg::Donate).collect();
        args.extend(state.iter().map(Arg::Donate));
        args.extend(grad_buffers.iter().map(Arg::Borrow));
        args.push(Arg::Borrow(&lr_buffer));
        let mut outputs = executable.execute_args(&args).unwrap();
        state = outputs.split_off(params.len());
        params = outputs;
    }
    assert_eq!(client.compile_stats().compiles, 1);
    // Each f32 step rounds a parameter of magnitude ≤ 1 by at most a few
    // 6e-8 ulps, so ten steps stay within 2e-6 of the f64 path — measured
    // against the parameters' scale (a parameter that crosses zero keeps the
    // absolute error of its earlier, larger values).
    let mut worst: f64 = 0.0;
    for (buffer, want) in params.iter().zip(&host_params) {
        for (got, want) in buffer.to_host::<f32>().unwrap().iter().zip(want) {
            worst = worst.max((f64::from(*got) - want).abs() / want.abs().max(1.0));
        }
    }
    assert!(worst <= 2e-6, "max error {worst} relative to the parameters' scale");
}

#[test]
fn sgd_with_momentum_matches_host() {
    let client = cpu_client(1);
    let device = client.device(0).unwrap();
    let sgd = Sgd {
        momentum: 0.9,
        weight_decay: 0.1,
    };
    let executable = update_program(&client, &sgd, &[vec![6]]);
    let p0 = f32s(&random_f64(6));
    let g = f32s(&random_f64(6));
    let (mut p, mut buf): (Vec<f64>, Vec<f64>) = (p0.iter().map(|&v| f64::from(v)).collect(), vec![0.0; 6]);
    let mut params = client.buffer_from_host(&p0, &[6], device).unwrap();
    let mut momentum = client.buffer_from_host(&[0.0f32; 6], &[6], device).unwrap();
    let grads = client.buffer_from_host(&g, &[6], device).unwrap();
    let lr = client.buffer_from_host(&[0.1f32], &[], device).unwrap();
    for _ in 0..3 {
        for i in 0..6 {
            buf[i] = 0.9 * buf[i] + (f64::from(g[i]) + 0.1 * p[i]);
            p[i] -= 0.1 * buf[i];
        }
        let mut out = executable
            .execute_args(&[
                Arg::Donate(&params),
                Arg::Donate(&momentum),
                Arg::Borrow(&grads),
                Arg::Borrow(&lr),
            ])
            .unwrap();
        momentum = out.pop().unwrap();
        params = out.pop().unwrap();
    }
    for (got, want) in params.to_host::<f32>().unwrap().iter().zip(&p) {
        assert!((f64::from(*got) - want).abs() < 1e-5, "{got} vs {want}");
    }
}

#[test]
fn global_norm_clipping_matches_torch_formula() {
    let client = cpu_client(1);
    for max_norm in [0.5, 100.0] {
        let graph = Graph::new("clip");
        let a = graph.parameter(ElementType::F64, &[3]).unwrap();
        let b = graph.parameter(ElementType::F64, &[2, 2]).unwrap();
        let (clipped, norm) = clip_by_global_norm(&[a, b], max_norm).unwrap();
        let executable = graph
            .build(&[&clipped[0], &clipped[1], &norm])
            .unwrap()
            .compile(&client)
            .unwrap();
        let (va, vb) = (random_f64(3), random_f64(4));
        let out = run_f64(&client, &executable, &[(va.clone(), vec![3]), (vb.clone(), vec![2, 2])]);
        let norm: f64 = va.iter().chain(&vb).map(|x| x * x).sum::<f64>().sqrt();
        let coef = (max_norm / (norm + 1e-6)).min(1.0);
        assert!((out[2][0] - norm).abs() < 1e-12);
        for (got, want) in out[0].iter().chain(&out[1]).zip(va.iter().chain(&vb)) {
            assert!((got - want * coef).abs() < 1e-12, "{got} vs {}", want * coef);
        }
    }
}

/// A 2-layer MLP `x → silu(x·W1 + b1)·W2 + b2` with MSE loss.
fn mlp_loss(params: &[Tensor], batch: &[Tensor]) -> grpo_xla::Result<Tensor> {
    let hidden = batch[0].matmul(&params[0])?.add(&params[1])?.silu()?;
    hidden.matmul(&params[2])?.add(&params[3])?.mse(&batch[1])
}

/// The MLP loss, with the batch's sum of squared errors as a metric.
fn mlp_loss_and_sse(params: &[Tensor], batch: &[Tensor]) -> grpo_xla::Result<(Tensor, Vec<Tensor>)> {
    let hidden = batch[0].matmul(&params[0])?.add(&params[1])?.silu()?;
    let error = hidden.matmul(&params[2])?.add(&params[3])?.sub(&batch[1])?;
    Ok((error.square()?.mean(&[0, 1])?, vec![error.square()?.sum_all()?]))
}

fn mlp_setup(client: &Client, batch: i64) -> (Vec<Buffer>, Vec<TensorType>, Vec<Buffer>) {
    let device = client.device(0).unwrap();
    let shapes: [Vec<i64>; 4] = [vec![4, 32], vec![32], vec![32, 1], vec![1]];
    let params: Vec<Buffer> = shapes
        .iter()
        .map(|d| {
            let values: Vec<f32> = random_f64(d.iter().product::<i64>() as usize)
                .iter()
                .map(|&v| (v * 0.5) as f32)
                .collect();
            client.buffer_from_host(&values, d, device).unwrap()
        })
        .collect();
    let types = shapes
        .iter()
        .map(|d| TensorType::new(ElementType::F32, d.clone()))
        .collect();
    // Targets of a smooth function of the inputs.
    let x = random_f64(batch as usize * 4);
    let y: Vec<f32> = x
        .chunks(4)
        .map(|r| ((r[0] * 2.0).sin() + r[1] * r[2] - 0.5 * r[3]) as f32)
        .collect();
    let data = vec![
        client.buffer_from_host(&f32s(&x), &[batch, 4], device).unwrap(),
        client.buffer_from_host(&y, &[batch, 1], device).unwrap(),
    ];
    (params, types, data)
}

/// Host values of `types` as arrays on the first device.
fn upload(client: &Client, values: &[Vec<f32>], types: &[TensorType]) -> Vec<ShardedBuffer> {
    let device = client.device(0).unwrap();
    values
        .iter()
        .zip(types)
        .map(|(v, t)| client.buffer_from_host(v, &t.dims, device).unwrap().into())
        .collect()
}

/// The 8-row batch `x` `[8, 4]`, `y` `[8, 1]` as two micro-batches of 4 rows.
fn halves(client: &Client, x: &[f32], y: &[f32]) -> Vec<[ShardedBuffer; 2]> {
    let device = client.device(0).unwrap();
    (0..2)
        .map(|h| {
            [
                client
                    .buffer_from_host(&x[h * 16..(h + 1) * 16], &[4, 4], device)
                    .unwrap()
                    .into(),
                client
                    .buffer_from_host(&y[h * 4..(h + 1) * 4], &[4, 1], device)
                    .unwrap()
                    .into(),
            ]
        })
        .collect()
}

/// One-device buffers as the whole arrays a train step takes.
fn whole(buffers: Vec<Buffer>) -> Vec<ShardedBuffer> {
    buffers.into_iter().map(ShardedBuffer::from).collect()
}

#[test]
fn an_mlp_trains_for_100_steps_in_one_compiled_program() {
    let client = cpu_client(1);
    let (params, types, data) = mlp_setup(&client, 64);
    let optimizer = AdamW::default();
    let spec = TrainStepSpec {
        params: types,
        frozen: Vec::new(),
        batch: data.iter().map(|b| b.tensor_type().clone()).collect(),
        optimizer: &optimizer,
        max_grad_norm: Some(1.0),
        accumulate: false,
        compute: ElementType::F32,
    };
    let mesh = Mesh::single(client.device(0).unwrap());
    let loss = |p: &[Tensor], _: &[Tensor], b: &[Tensor]| Ok((mlp_loss(p, b)?, Vec::new()));
    let step = TrainStep::compile(&client, &spec, &mesh, loss).unwrap();
    let mut state = step.init_state(whole(params), Vec::new()).unwrap();
    let data = whole(data);
    let batch = [data.iter().collect::<Vec<_>>()];
    let first = step.step(&mut state, &batch, 1e-2).unwrap();
    let live_after_first = client.live_buffers();
    let mut last = first.clone();
    for _ in 1..100 {
        last = step.step(&mut state, &batch, 1e-2).unwrap();
        assert!(last.loss.is_finite() && last.grad_norm.is_finite());
    }
    assert!(last.loss < 0.2 * first.loss, "loss {} → {}", first.loss, last.loss);
    assert_eq!(client.compile_stats().compiles, 1, "one program for the whole run");
    assert_eq!(
        client.live_buffers(),
        live_after_first,
        "donation keeps device memory flat"
    );
    let two = [batch[0].clone(), batch[0].clone()];
    let refused = step.step(&mut state, &two, 1e-2).unwrap_err().to_string();
    assert!(
        refused.contains("given 2 micro-batches") && refused.contains("accumulate"),
        "{refused}"
    );
}

#[test]
fn accumulated_micro_batches_equal_one_full_batch() {
    let client = cpu_client(1);
    let device = client.device(0).unwrap();
    let (params, types, data) = mlp_setup(&client, 8);
    let host: Vec<Vec<f32>> = params.iter().map(|p| p.to_host::<f32>().unwrap()).collect();
    let mesh = Mesh::single(device);
    let optimizer = AdamW::default();
    let full_spec = TrainStepSpec {
        params: types.clone(),
        frozen: Vec::new(),
        batch: data.iter().map(|b| b.tensor_type().clone()).collect(),
        optimizer: &optimizer,
        max_grad_norm: Some(1.0),
        accumulate: false,
        compute: ElementType::F32,
    };
    let full = TrainStep::compile(
        &client,
        &full_spec,
        &mesh,
        |p: &[Tensor], _: &[Tensor], b: &[Tensor]| mlp_loss_and_sse(p, b),
    )
    .unwrap();
    let mut full_state = full.init_state(upload(&client, &host, &types), Vec::new()).unwrap();
    let (x, y) = (data[0].to_host::<f32>().unwrap(), data[1].to_host::<f32>().unwrap());
    let data = whole(data);
    let full_metrics = full.step(&mut full_state, &[data.iter().collect()], 1e-2).unwrap();

    let halves = halves(&client, &x, &y);
    let micro_spec = TrainStepSpec {
        params: types.clone(),
        frozen: Vec::new(),
        batch: halves[0].iter().map(|b| b.tensor_type().clone()).collect(),
        optimizer: &optimizer,
        max_grad_norm: Some(1.0),
        accumulate: true,
        compute: ElementType::F32,
    };
    let accumulating = TrainStep::compile(
        &client,
        &micro_spec,
        &mesh,
        |p: &[Tensor], _: &[Tensor], b: &[Tensor]| mlp_loss_and_sse(p, b),
    )
    .unwrap();
    let mut micro_state = accumulating
        .init_state(upload(&client, &host, &types), Vec::new())
        .unwrap();
    let micro_batches: Vec<Vec<&ShardedBuffer>> = halves.iter().map(|h| h.iter().collect()).collect();
    let micro_metrics = accumulating.step(&mut micro_state, &micro_batches, 1e-2).unwrap();

    assert!((full_metrics.loss - micro_metrics.loss).abs() < 1e-5 * full_metrics.loss.abs().max(1.0));
    assert!((full_metrics.grad_norm - micro_metrics.grad_norm).abs() < 1e-4);
    let (sse, sse_sum) = (full_metrics.metrics[0], micro_metrics.metrics[0]);
    assert!(
        (sse - sse_sum).abs() < 1e-5 * sse.max(1.0),
        "metrics add up: {sse} vs {sse_sum}"
    );
    assert!(
        (sse / 8.0 - full_metrics.loss).abs() < 1e-5,
        "the metric is the batch's squared error"
    );
    for (a, b) in full_state.params.iter().zip(&micro_state.params) {
        for (x, y) in a.to_host::<f32>().unwrap().iter().zip(b.to_host::<f32>().unwrap()) {
            assert!((x - y).abs() < 1e-5, "{x} vs {y}");
        }
    }
}

#[test]
fn bf16_compute_converts_the_parameters_once_a_step_and_updates_as_converting_in_each_micro_batch() {
    let client = cpu_client(1);
    let device = client.device(0).unwrap();
    let (params, types, data) = mlp_setup(&client, 8);
    let host: Vec<Vec<f32>> = params.iter().map(|p| p.to_host::<f32>().unwrap()).collect();
    let (x, y) = (data[0].to_host::<f32>().unwrap(), data[1].to_host::<f32>().unwrap());
    let halves = halves(&client, &x, &y);
    let micro_batches: Vec<Vec<&ShardedBuffer>> = halves.iter().map(|h| h.iter().collect()).collect();
    let mesh = Mesh::single(device);
    let optimizer = AdamW::default();
    let bf16 = |tensors: &[Tensor]| -> grpo_xla::Result<Vec<Tensor>> {
        tensors.iter().map(|t| t.convert(ElementType::Bf16)).collect()
    };
    let spec = |compute| TrainStepSpec {
        params: types.clone(),
        frozen: Vec::new(),
        batch: halves[0].iter().map(|b| b.tensor_type().clone()).collect(),
        optimizer: &optimizer,
        max_grad_norm: Some(1.0),
        accumulate: true,
        compute,
    };
    // The step converts: the loss receives bf16 parameters.
    let once = TrainStep::compile(
        &client,
        &spec(ElementType::Bf16),
        &mesh,
        |p: &[Tensor], _: &[Tensor], b: &[Tensor]| {
            assert!(
                p.iter().all(|t| t.dtype() == ElementType::Bf16),
                "the loss sees the converted parameters"
            );
            mlp_loss_and_sse(p, &bf16(b)?)
        },
    )
    .unwrap();
    assert_eq!(
        client.compile_stats().compiles,
        4,
        "conversion, first, accumulate, apply"
    );
    // The loss converts, in every micro-batch's program.
    let each = TrainStep::compile(
        &client,
        &spec(ElementType::F32),
        &mesh,
        |p: &[Tensor], _: &[Tensor], b: &[Tensor]| mlp_loss_and_sse(&bf16(p)?, &bf16(b)?),
    )
    .unwrap();
    let mut once_state = once.init_state(upload(&client, &host, &types), Vec::new()).unwrap();
    let mut each_state = each.init_state(upload(&client, &host, &types), Vec::new()).unwrap();
    for step in 0..3 {
        let a = once.step(&mut once_state, &micro_batches, 1e-2).unwrap();
        let b = each.step(&mut each_state, &micro_batches, 1e-2).unwrap();
        assert_eq!(
            (a.loss, a.grad_norm, &a.metrics),
            (b.loss, b.grad_norm, &b.metrics),
            "step {step}"
        );
        for (p, q) in once_state.params.iter().zip(&each_state.params) {
            assert_eq!(p.tensor_type().dtype, ElementType::F32, "master weights stay f32");
            assert_eq!(p.to_host::<f32>().unwrap(), q.to_host::<f32>().unwrap(), "step {step}");
        }
    }
    assert_ne!(
        host[0],
        once_state.params[0].to_host::<f32>().unwrap(),
        "the step trains"
    );
}

#[test]
fn build_errors_name_the_op_and_the_graph_is_cleaned_up() {
    let graph = Graph::new("g");
    let x = graph.parameter(ElementType::F32, &[2, 3]).unwrap();
    let other = Graph::new("other");
    let y = other.parameter(ElementType::F32, &[2, 3]).unwrap();
    let foreign = x.add(&y).unwrap_err().to_string();
    assert!(
        foreign.contains("graph `other`") && foreign.contains("graph `g`"),
        "{foreign}"
    );
    let bad = x.reshape(&[4, 2]).unwrap_err().to_string();
    assert!(bad.starts_with("reshape") && bad.contains("[4, 2]"), "{bad}");

    // The same subexpression twice and an unused branch: both disappear.
    let a = x.exp().unwrap();
    let b = x.exp().unwrap();
    let _unused = x.tanh().unwrap().sum_all().unwrap();
    let out = a.add(&b).unwrap();
    let function = graph.build(&[&out]).unwrap();
    let text = function.to_stablehlo().unwrap();
    assert_eq!(text.matches("stablehlo.exponential").count(), 1, "{text}");
    assert!(!text.contains("stablehlo.tanh"), "{text}");
    assert_eq!(function.node_count(), 3, "parameter, exp, add:\n{text}");
    let late = x.exp().unwrap_err().to_string();
    assert!(late.contains("already built"), "{late}");
}

#[test]
fn frozen_inputs_get_no_update_and_the_rest_trains_as_with_everything_trained() {
    let client = cpu_client(1);
    let device = client.device(0).unwrap();
    let (params, types, data) = mlp_setup(&client, 16);
    let host: Vec<Vec<f32>> = params.iter().map(|p| p.to_host::<f32>().unwrap()).collect();
    let upload = |range: std::ops::Range<usize>| -> Vec<ShardedBuffer> {
        range
            .map(|i| {
                client
                    .buffer_from_host(&host[i], &types[i].dims, device)
                    .unwrap()
                    .into()
            })
            .collect()
    };
    let optimizer = Sgd::default();
    let mesh = Mesh::single(device);
    let batch_types: Vec<TensorType> = data.iter().map(|b| b.tensor_type().clone()).collect();
    let data = whole(data);
    let batch: Vec<&ShardedBuffer> = data.iter().collect();

    // Everything trained: the reference gradients of the output layer.
    let all = TrainStepSpec {
        params: types.clone(),
        frozen: Vec::new(),
        batch: batch_types.clone(),
        optimizer: &optimizer,
        max_grad_norm: None,
        accumulate: false,
        compute: ElementType::F32,
    };
    let loss = |p: &[Tensor], _: &[Tensor], b: &[Tensor]| Ok((mlp_loss(p, b)?, Vec::new()));
    let everything = TrainStep::compile(&client, &all, &mesh, loss).unwrap();
    let mut full = everything.init_state(upload(0..4), Vec::new()).unwrap();
    let want = everything.step(&mut full, std::slice::from_ref(&batch), 0.1).unwrap();
    let want_out: Vec<Vec<f32>> = full.params[2..].iter().map(|p| p.to_host::<f32>().unwrap()).collect();

    // The first layer frozen: the loss sees it after the trained ones.
    for accumulate in [false, true] {
        let spec = TrainStepSpec {
            params: types[2..].to_vec(),
            frozen: types[..2].to_vec(),
            batch: batch_types.clone(),
            optimizer: &optimizer,
            max_grad_norm: None,
            accumulate,
            compute: ElementType::F32,
        };
        let loss = |trained: &[Tensor], frozen: &[Tensor], b: &[Tensor]| {
            let all = [&frozen[0], &frozen[1], &trained[0], &trained[1]].map(Clone::clone);
            Ok((mlp_loss(&all, b)?, Vec::new()))
        };
        let step = TrainStep::compile(&client, &spec, &mesh, loss).unwrap();
        let mut state = step.init_state(upload(2..4), upload(0..2)).unwrap();
        let micro_batches = if accumulate {
            vec![batch.clone(), batch.clone()]
        } else {
            vec![batch.clone()]
        };
        let got = step.step(&mut state, &micro_batches, 0.1).unwrap();
        assert!(
            (got.loss - want.loss).abs() <= 1e-6 * want.loss.abs(),
            "{got:?} vs {want:?}"
        );
        // The gradient norm covers the trained parameters only.
        assert!(got.grad_norm < want.grad_norm, "{got:?} vs {want:?}");
        for (p, want) in state.params.iter().zip(&want_out) {
            let got = p.to_host::<f32>().unwrap();
            for (a, b) in got.iter().zip(want) {
                assert!((a - b).abs() <= 1e-6, "{a} vs {b} (accumulate {accumulate})");
            }
        }
        for (f, want) in state.frozen.iter().zip(&host[..2]) {
            assert_eq!(&f.to_host::<f32>().unwrap(), want, "frozen inputs stay");
        }
    }
}
