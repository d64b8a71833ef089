//! SPMD sharding through XLA's partitioner on 4 virtual CPU devices: a
//! row-split matmul against host f64 math, data-parallel and FSDP train
//! steps (whole and accumulated over micro-batches) against the
//! single-device step, FSDP's per-device memory, and
//! clear errors for layouts and calls that cannot work.

mod common;

use common::{cpu_client, matmul_f64, random_f64};
use grpo_xla::trace::{AdamW, Graph, Mesh, Parallelism, Tensor, TrainState, TrainStep, TrainStepSpec};
use grpo_xla::{Arg, Buffer, Client, CompileOptions, ElementType, Error, ShardedBuffer, Sharding, TensorType};

const DEVICES: usize = 4;

fn f32s(values: &[f64]) -> Vec<f32> {
    values.iter().map(|&v| v as f32).collect()
}

fn f64s(values: &[f32]) -> Vec<f64> {
    values.iter().map(|&v| f64::from(v)).collect()
}

/// `(a · b, Σ a·b)` with `a` split into row blocks, `b` replicated, the
/// product split like `a` and the sum replicated.
fn row_split_matmul(m: i64, k: i64, n: i64) -> grpo_xla::trace::Function {
    let graph = Graph::new("row_split_matmul");
    let a = graph.parameter(ElementType::F32, &[m, k]).unwrap();
    let b = graph.parameter(ElementType::F32, &[k, n]).unwrap();
    let c = a.matmul(&b).unwrap();
    let total = c.sum_all().unwrap();
    let rows = Sharding::split(0, DEVICES);
    graph
        .build(&[&c, &total])
        .unwrap()
        .sharded(
            DEVICES,
            vec![rows.clone(), Sharding::replicated()],
            vec![rows, Sharding::replicated()],
        )
        .unwrap()
}

#[test]
fn a_row_split_matmul_equals_the_host_product() {
    let client = cpu_client(DEVICES);
    let (m, k, n) = (16usize, 24usize, 12usize);
    let function = row_split_matmul(m as i64, k as i64, n as i64);
    let text = function.to_stablehlo().unwrap();
    assert!(text.contains(r#"mhlo.sharding = "{devices=[4,1]<=[4]}""#), "{text}");
    let executable = function.compile(&client).unwrap();
    assert_eq!(executable.devices(), client.devices());
    // The partitioned program works on shards: each device makes 4 of the 16 rows.
    let shard_types: Vec<String> = executable.output_types().iter().map(TensorType::mlir).collect();
    assert_eq!(shard_types, ["tensor<4x12xf32>", "tensor<f32>"]);

    let (a, b) = (f32s(&random_f64(m * k)), f32s(&random_f64(k * n)));
    let (want, scale) = matmul_f64(&f64s(&a), &f64s(&b), m, k, n);
    let rows = Sharding::split(0, DEVICES);
    let devices = client.devices();
    let a_rows = client
        .sharded_from_host(&a, &[m as i64, k as i64], &rows, devices)
        .unwrap();
    let b_all = (client.sharded_from_host(&b, &[k as i64, n as i64], &Sharding::replicated(), devices)).unwrap();
    assert_eq!(a_rows.shards()[1].dims(), [4, 24]);
    let out = executable
        .execute_sharded(&[Arg::Borrow(&a_rows), Arg::Borrow(&b_all)])
        .unwrap();
    assert_eq!(out[0].tensor_type().dims, [m as i64, n as i64]);
    let got = f64s(&out[0].to_host::<f32>().unwrap());
    let worst = got
        .iter()
        .zip(&want)
        .zip(&scale)
        .map(|((g, w), s)| (g - w).abs() / s)
        .fold(0.0, f64::max);
    println!("row-split matmul {m}x{k}x{n}: worst error {worst:.2e} of Σ|a||b|");
    assert!(worst < 1e-6, "relative error {worst}");
    // Device 2 holds rows 8..12 of the product, as the sharding says.
    let shard = f64s(&out[0].shards()[2].to_host::<f32>().unwrap());
    for (got, want) in shard.iter().zip(&want[8 * n..12 * n]) {
        assert!((got - want).abs() < 1e-5, "{got} vs {want}");
    }
    // The replicated sum is the whole product's, on every device.
    let sum: f64 = want.iter().sum();
    for device_sum in out[1].shards() {
        let got = f64::from(device_sum.to_host::<f32>().unwrap()[0]);
        assert!((got - sum).abs() < 1e-4 * scale.iter().sum::<f64>(), "{got} vs {sum}");
    }

    // The same call as per-device argument lists of shards cut on the host.
    let lists: Vec<Vec<Buffer>> = (rows.shard_host(&a, &[m as i64, k as i64], DEVICES).unwrap().iter())
        .zip(devices)
        .map(|(part, device)| {
            vec![
                client.buffer_from_host(part, &[4, k as i64], device).unwrap(),
                client.buffer_from_host(&b, &[k as i64, n as i64], device).unwrap(),
            ]
        })
        .collect();
    let arg_lists: Vec<Vec<Arg<'_>>> = lists.iter().map(|l| l.iter().map(Arg::Borrow).collect()).collect();
    let arg_refs: Vec<&[Arg<'_>]> = arg_lists.iter().map(Vec::as_slice).collect();
    let per_device = executable.execute_replicated(&arg_refs).unwrap();
    let shards: Vec<Vec<f32>> = per_device.iter().map(|o| o[0].to_host::<f32>().unwrap()).collect();
    assert_eq!(
        rows.gather_host(&[m as i64, n as i64], &shards).unwrap(),
        out[0].to_host::<f32>().unwrap()
    );
}

/// A 2-layer MLP `x → tanh(x·W1 + b1)·W2 + b2` with MSE loss.
fn mlp_loss(params: &[Tensor], batch: &[Tensor]) -> grpo_xla::Result<Tensor> {
    let hidden = batch[0].matmul(&params[0])?.add(&params[1])?.tanh()?;
    hidden.matmul(&params[2])?.add(&params[3])?.mse(&batch[1])
}

/// W1 8×32, b1 32, W2 32×3 split four ways under FSDP; b2 (3) stays replicated.
const PARAM_DIMS: [&[i64]; 4] = [&[8, 32], &[32], &[32, 3], &[3]];
const BATCH: i64 = 16;

fn param_types() -> Vec<TensorType> {
    PARAM_DIMS
        .iter()
        .map(|d| TensorType::new(ElementType::F32, *d))
        .collect()
}

fn batch_types() -> Vec<TensorType> {
    vec![
        TensorType::new(ElementType::F32, [BATCH, 8]),
        TensorType::new(ElementType::F32, [BATCH, 3]),
    ]
}

/// Starting parameters and five batches (inputs, targets), as host data.
struct MlpData {
    params: Vec<Vec<f32>>,
    batches: Vec<[Vec<f32>; 2]>,
}

fn mlp_data() -> MlpData {
    let params = param_types()
        .iter()
        .map(|t| f32s(&random_f64(t.element_count())).iter().map(|v| v * 0.5).collect())
        .collect();
    let batches = (0..5)
        .map(|_| {
            let x = random_f64(BATCH as usize * 8);
            let y: Vec<f64> = x
                .chunks(8)
                .flat_map(|r| [(r[0] * 2.0).sin() + r[1] * r[2], r[3] - r[4], 3.0 * r[5] * r[6]])
                .collect();
            [f32s(&x), f32s(&y)]
        })
        .collect();
    MlpData { params, batches }
}

/// The trained parameters and each step's (loss, grad norm).
type Run = (Vec<Vec<f32>>, Vec<(f32, f32)>);

const LR: f32 = 2e-2;
/// Small enough that every step clips.
const MAX_GRAD_NORM: f64 = 0.5;

/// Host arrays of types `types` laid out on `mesh` as `shardings` say.
fn laid_out(
    client: &Client,
    mesh: &Mesh,
    arrays: &[Vec<f32>],
    types: &[TensorType],
    shardings: &[Sharding],
) -> Vec<ShardedBuffer> {
    arrays
        .iter()
        .zip(types)
        .zip(shardings)
        .map(|((a, t), s)| mesh.from_host(client, a, &t.dims, s).unwrap())
        .collect()
}

/// Optimizer steps of `spec` on `mesh` from the data's parameters, each
/// step over its micro-batches of `steps`: the trained parameters, each
/// step's metrics, and each device's bytes of parameters and state.
fn run_on(
    client: &Client,
    spec: &TrainStepSpec<'_>,
    mesh: &Mesh,
    data: &MlpData,
    steps: &[&[[Vec<f32>; 2]]],
) -> (Run, Vec<usize>) {
    let loss = |p: &[Tensor], _: &[Tensor], b: &[Tensor]| Ok((mlp_loss(p, b)?, Vec::new()));
    let step = TrainStep::compile(client, spec, mesh, loss).unwrap();
    let mut state = step
        .init_state(
            laid_out(client, mesh, &data.params, &spec.params, step.param_shardings()),
            Vec::new(),
        )
        .unwrap();
    let compiles = client.compile_stats().compiles;
    let mut metrics = Vec::new();
    for micro_batches in steps {
        let address = |state: &TrainState| state.params[0].shards().last().unwrap().device_address().unwrap();
        let before = address(&state);
        let uploaded: Vec<Vec<ShardedBuffer>> = micro_batches
            .iter()
            .map(|batch| laid_out(client, mesh, batch, &spec.batch, step.batch_shardings()))
            .collect();
        let refs: Vec<Vec<&ShardedBuffer>> = uploaded.iter().map(|b| b.iter().collect()).collect();
        let m = step.step(&mut state, &refs, LR).unwrap();
        metrics.push((m.loss, m.grad_norm));
        assert_eq!(
            before,
            address(&state),
            "{mesh:?}: the update happens in place (donated)"
        );
    }
    assert_eq!(
        client.compile_stats().compiles,
        compiles,
        "one set of programs for every step"
    );
    assert_eq!(step.mesh().devices(), mesh.devices());
    let params = state.params.iter().map(|p| p.to_host().unwrap()).collect();
    ((params, metrics), state.device_bytes())
}

/// Five steps of one batch each.
fn whole_steps(data: &MlpData) -> Vec<&[[Vec<f32>; 2]]> {
    data.batches.iter().map(std::slice::from_ref).collect()
}

/// Two steps over micro-batches 0–1 and 2–3 (gradients accumulated).
fn accumulated_steps(data: &MlpData) -> Vec<&[[Vec<f32>; 2]]> {
    data.batches[..4].chunks(2).collect()
}

/// A mesh of the client's first device.
fn one_device(client: &Client) -> Mesh {
    Mesh::single(client.device(0).unwrap())
}

/// A mesh of all [`DEVICES`] laid out by `parallelism`.
fn all_devices(client: &Client, parallelism: Parallelism) -> Mesh {
    Mesh::new(client, Some(parallelism)).unwrap()
}

/// ‖a − b‖ / ‖b‖.
fn relative_error(a: &[f32], b: &[f32]) -> f64 {
    let diff: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2))
        .sum();
    let norm: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    (diff / norm).sqrt()
}

/// The MLP's train step: AdamW, clipping at [`MAX_GRAD_NORM`].
fn mlp_spec(optimizer: &AdamW) -> TrainStepSpec<'_> {
    TrainStepSpec {
        params: param_types(),
        frozen: Vec::new(),
        batch: batch_types(),
        optimizer,
        max_grad_norm: Some(MAX_GRAD_NORM),
        accumulate: false,
        compute: ElementType::F32,
    }
}

#[test]
fn data_parallel_and_fsdp_steps_equal_the_single_device_step() {
    let client = cpu_client(DEVICES);
    let optimizer = AdamW::default();
    let spec = mlp_spec(&optimizer);
    let data = mlp_data();
    let ((want, want_metrics), _) = run_on(&client, &spec, &one_device(&client), &data, &whole_steps(&data));
    assert!(
        want_metrics.iter().all(|&(_, norm)| f64::from(norm) > MAX_GRAD_NORM),
        "every step clips: {want_metrics:?}"
    );
    assert!(relative_error(&want[0], &data.params[0]) > 1e-3, "the parameters moved");
    for parallelism in [
        Parallelism::DataParallel { devices: DEVICES },
        Parallelism::Fsdp { devices: DEVICES },
    ] {
        let mesh = all_devices(&client, parallelism);
        let ((got, metrics), _) = run_on(&client, &spec, &mesh, &data, &whole_steps(&data));
        let errors: Vec<f64> = got.iter().zip(&want).map(|(g, w)| relative_error(g, w)).collect();
        let shown: Vec<String> = errors.iter().map(|e| format!("{e:.2e}")).collect();
        println!("{parallelism:?}: parameter relative errors after 5 steps {shown:?}");
        assert!(errors.iter().all(|&e| e <= 1e-5), "{parallelism:?}: {errors:?}");
        for ((loss, norm), (want_loss, want_norm)) in metrics.iter().zip(&want_metrics) {
            assert!(
                (loss - want_loss).abs() <= 1e-5 * want_loss.abs(),
                "loss {loss} vs {want_loss}"
            );
            assert!(
                (norm - want_norm).abs() <= 1e-5 * want_norm,
                "grad norm {norm} vs {want_norm}"
            );
        }
    }
}

#[test]
fn accumulated_sharded_steps_equal_the_accumulated_single_device_step() {
    let client = cpu_client(DEVICES);
    let optimizer = AdamW::default();
    let spec = TrainStepSpec {
        accumulate: true,
        ..mlp_spec(&optimizer)
    };
    let data = mlp_data();
    let steps = accumulated_steps(&data);
    let ((want, want_metrics), _) = run_on(&client, &spec, &one_device(&client), &data, &steps);
    assert!(relative_error(&want[0], &data.params[0]) > 1e-3, "the parameters moved");
    for parallelism in [
        Parallelism::DataParallel { devices: DEVICES },
        Parallelism::Fsdp { devices: DEVICES },
    ] {
        let ((got, metrics), _) = run_on(&client, &spec, &all_devices(&client, parallelism), &data, &steps);
        let errors: Vec<f64> = got.iter().zip(&want).map(|(g, w)| relative_error(g, w)).collect();
        println!("{parallelism:?}, 2 micro-batches per step: parameter relative errors {errors:?}");
        assert!(errors.iter().all(|&e| e <= 1e-5), "{parallelism:?}: {errors:?}");
        for ((loss, norm), (want_loss, want_norm)) in metrics.iter().zip(&want_metrics) {
            assert!(
                (loss - want_loss).abs() <= 1e-5 * want_loss.abs(),
                "loss {loss} vs {want_loss}"
            );
            assert!(
                (norm - want_norm).abs() <= 1e-5 * want_norm,
                "grad norm {norm} vs {want_norm}"
            );
        }
    }
}

#[test]
fn fsdp_keeps_a_quarter_of_parameters_and_optimizer_state_per_device() {
    let client = cpu_client(DEVICES);
    let optimizer = AdamW::default();
    let spec = mlp_spec(&optimizer);
    // Parameters, m and v (3 copies of each parameter) plus the f32 step counter.
    let whole: usize = 3 * param_types().iter().map(TensorType::byte_size).sum::<usize>() + 4;
    let data = mlp_data();
    let run = |parallelism| {
        run_on(
            &client,
            &spec,
            &all_devices(&client, parallelism),
            &data,
            &whole_steps(&data),
        )
        .1
    };
    let (fsdp, data_parallel) = (
        run(Parallelism::Fsdp { devices: DEVICES }),
        run(Parallelism::DataParallel { devices: DEVICES }),
    );
    println!(
        "parameters + AdamW state: whole {whole} B; per device: FSDP {fsdp:?} B, data parallel {data_parallel:?} B"
    );
    assert_eq!(
        data_parallel,
        vec![whole; DEVICES],
        "data parallel replicates everything"
    );
    for bytes in fsdp {
        let fraction = bytes as f64 / whole as f64;
        // A quarter, plus b2 (3 values) and the step counter, which stay replicated.
        assert!(
            (0.25..0.27).contains(&fraction),
            "{bytes} B is {fraction:.3} of {whole} B"
        );
    }
}

#[test]
fn layouts_that_do_not_fit_are_errors_before_xla() {
    let client = cpu_client(DEVICES);
    let graph = Graph::new("uneven");
    let x = graph.parameter(ElementType::F32, &[6, 4]).unwrap();
    let y = x.tanh().unwrap();
    let function = graph.build(&[&y]).unwrap();
    let split = || vec![Sharding::split(0, DEVICES)];
    let uneven = function.clone().sharded(DEVICES, split(), split()).unwrap_err();
    assert!(matches!(uneven, Error::Sharding { .. }), "{uneven:?}");
    let message = uneven.to_string();
    assert!(
        message.contains("parameter 0 of `uneven`") && message.contains("dimension 0 (6) does not divide into 4"),
        "{message}"
    );
    let devices = function
        .clone()
        .sharded(DEVICES, vec![Sharding::split(1, 2)], vec![Sharding::replicated()])
        .unwrap_err()
        .to_string();
    assert!(devices.contains("need 2 devices, not 4"), "{devices}");
    let count = function
        .clone()
        .sharded(DEVICES, vec![], vec![])
        .unwrap_err()
        .to_string();
    assert!(count.contains("a sharding per parameter (1) and output (1)"), "{count}");

    let host = client
        .sharded_from_host(&[0.0f32; 24], &[6, 4], &Sharding::split(0, DEVICES), client.devices())
        .unwrap_err()
        .to_string();
    assert!(
        host.contains("a host array") && host.contains("does not divide"),
        "{host}"
    );

    // A batch whose dimension 0 does not split over the devices.
    let optimizer = AdamW::default();
    let spec = TrainStepSpec {
        params: param_types(),
        frozen: Vec::new(),
        batch: vec![
            TensorType::new(ElementType::F32, [6, 8]),
            TensorType::new(ElementType::F32, [6, 3]),
        ],
        optimizer: &optimizer,
        max_grad_norm: None,
        accumulate: false,
        compute: ElementType::F32,
    };
    let loss = |p: &[Tensor], _: &[Tensor], b: &[Tensor]| Ok((mlp_loss(p, b)?, Vec::new()));
    let fsdp = all_devices(&client, Parallelism::Fsdp { devices: DEVICES });
    let batch = TrainStep::compile(&client, &spec, &fsdp, loss)
        .err()
        .expect("an uneven batch is refused")
        .to_string();
    assert!(
        batch.contains("batch input 0") && batch.contains("dimension 0 (6)"),
        "{batch}"
    );
    let too_many = Mesh::new(&client, Some(Parallelism::DataParallel { devices: 6 }))
        .unwrap_err()
        .to_string();
    assert!(too_many.contains("spans 6 devices, the client has 4"), "{too_many}");

    // A sharded function compiled for one device.
    let (m, k, n) = (8, 4, 2);
    let sharded = row_split_matmul(m, k, n);
    let single = sharded
        .compile_with(&client, &CompileOptions::default())
        .unwrap_err()
        .to_string();
    assert!(single.contains("1 replica × 4 partitions"), "{single}");
}

#[test]
fn calls_that_do_not_match_the_partitions_are_errors_before_xla() {
    let client = cpu_client(DEVICES);
    let (m, k, n) = (8, 4, 2);
    let executable = row_split_matmul(m, k, n).compile(&client).unwrap();
    let devices = client.devices();
    let rows = Sharding::split(0, DEVICES);
    let a = client
        .sharded_from_host(&[1.0f32; 32], &[m, k], &rows, devices)
        .unwrap();
    let b = client
        .sharded_from_host(&[1.0f32; 8], &[k, n], &Sharding::replicated(), devices)
        .unwrap();

    // Three argument lists for four partitions.
    let lists: Vec<Vec<Arg<'_>>> = (0..3)
        .map(|d| vec![Arg::Borrow(&a.shards()[d]), Arg::Borrow(&b.shards()[d])])
        .collect();
    let refs: Vec<&[Arg<'_>]> = lists.iter().map(Vec::as_slice).collect();
    let three = executable.execute_replicated(&refs).unwrap_err();
    assert!(
        matches!(
            three,
            Error::DeviceCount {
                expected: 4,
                found: 3,
                ..
            }
        ),
        "{three}"
    );

    // The whole array where each device needs its shard.
    let whole = client.buffer_from_host(&[1.0f32; 32], &[m, k], &devices[0]).unwrap();
    let lists: Vec<Vec<Arg<'_>>> = (0..DEVICES)
        .map(|d| vec![Arg::Borrow(&whole), Arg::Borrow(&b.shards()[d])])
        .collect();
    let refs: Vec<&[Arg<'_>]> = lists.iter().map(Vec::as_slice).collect();
    let message = executable.execute_replicated(&refs).unwrap_err().to_string();
    assert!(
        message.contains("must be its shard f32[2, 4]") && message.contains("got f32[8, 4]"),
        "{message}"
    );

    // A sharded array laid out another way than its parameter, and one argument too few.
    let columns = client
        .sharded_from_host(&[1.0f32; 32], &[m, k], &Sharding::split(1, DEVICES), devices)
        .unwrap();
    let layout = executable
        .execute_sharded(&[Arg::Borrow(&columns), Arg::Borrow(&b)])
        .unwrap_err()
        .to_string();
    assert!(
        layout.contains("must be sharded split dimension 0 in 4, it is sharded split dimension 1 in 4"),
        "{layout}"
    );
    let few = executable.execute_sharded(&[Arg::Borrow(&a)]).unwrap_err();
    assert!(
        matches!(
            few,
            Error::ArgumentCount {
                expected: 2,
                found: 1,
                ..
            }
        ),
        "{few}"
    );
    // Nothing was consumed: the right call still works.
    let out = executable.execute_sharded(&[Arg::Borrow(&a), Arg::Borrow(&b)]).unwrap();
    assert_eq!(out[0].to_host::<f32>().unwrap(), vec![4.0f32; 16]);
}

/// Multi-host SPMD needs a client spanning processes (the PJRT distributed
/// runtime: create options `num_nodes` / `node_id` and the key-value store
/// callbacks). The pinned CPU plugin has none of it: it refuses the options
/// by name, and a `process_id` only renumbers its own devices, so learners
/// on several hosts stay single-process on CPU (README: "Multi-host").
#[test]
fn the_cpu_plugin_has_no_multi_process_client() {
    use grpo_xla::pjrt::OptionValue;
    use grpo_xla::{ClientOptions, Platform, Plugin};
    let plugin = Plugin::find(Platform::Cpu).unwrap();
    for option in ["num_nodes", "node_id"] {
        let mut options = ClientOptions::default().compile_cache_dir(None);
        options.create_options.push((option.to_string(), OptionValue::Int(2)));
        let refused = grpo_xla::Client::new(&plugin, options).expect_err("refused");
        assert!(refused.to_string().contains(option), "{refused}");
    }
    let mut options = ClientOptions::default().compile_cache_dir(None).cpu_device_count(2);
    options
        .create_options
        .push(("process_id".to_string(), OptionValue::Int(1)));
    let client = grpo_xla::Client::new(&plugin, options).unwrap();
    assert_eq!(client.devices().len(), 2, "only this process's devices");
}
