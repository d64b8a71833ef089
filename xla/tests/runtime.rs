//! The PJRT runtime on the real plugin: transfers, matmul against f64 host
//! math, several outputs, donation, several devices and threads.

mod common;

use common::{clients, cpu_client, donating_add_program, matmul_f64, matmul_program, random_f64};
use grpo_xla::{Arg, Buffer, Client, CompileOptions, ElementType, Error, Pred, TensorType};
use half::{bf16, f16};

fn upload<T: grpo_xla::NativeType>(client: &Client, data: &[T], dims: &[i64]) -> Buffer {
    client.buffer_from_host(data, dims, client.device(0).unwrap()).unwrap()
}

/// Worst error relative to Σ|a||b| of the same element.
fn worst_relative_error(got: &[f64], want: &[f64], scale: &[f64]) -> f64 {
    got.iter()
        .zip(want)
        .zip(scale)
        .map(|((g, w), s)| (g - w).abs() / s.max(1e-30))
        .fold(0.0, f64::max)
}

#[test]
fn matmul_f32_matches_f64_reference() {
    for client in clients() {
        for (m, k, n) in [(1, 1, 1), (37, 64, 29), (128, 256, 96)] {
            let a = random_f64(m * k);
            let b = random_f64(k * n);
            let a32: Vec<f32> = a.iter().map(|&v| v as f32).collect();
            let b32: Vec<f32> = b.iter().map(|&v| v as f32).collect();
            let program = client
                .compile(&matmul_program(m, k, n, ElementType::F32), &CompileOptions::default())
                .unwrap();
            let out = program
                .execute(&[
                    &upload(&client, &a32, &[m as i64, k as i64]),
                    &upload(&client, &b32, &[k as i64, n as i64]),
                ])
                .unwrap();
            assert_eq!(out[0].dims(), [m as i64, n as i64]);
            let got: Vec<f64> = out[0].to_host::<f32>().unwrap().iter().map(|&v| f64::from(v)).collect();
            let a_rounded: Vec<f64> = a32.iter().map(|&v| f64::from(v)).collect();
            let b_rounded: Vec<f64> = b32.iter().map(|&v| f64::from(v)).collect();
            let (want, scale) = matmul_f64(&a_rounded, &b_rounded, m, k, n);
            let error = worst_relative_error(&got, &want, &scale);
            assert!(
                error < 1e-5,
                "{} f32 {m}x{k}x{n}: relative error {error}",
                client.platform_name()
            );
        }
    }
}

#[test]
fn matmul_bf16_matches_f64_reference() {
    for client in clients() {
        let (m, k, n) = (64, 128, 48);
        let a: Vec<bf16> = random_f64(m * k).into_iter().map(bf16::from_f64).collect();
        let b: Vec<bf16> = random_f64(k * n).into_iter().map(bf16::from_f64).collect();
        let program = client
            .compile(&matmul_program(m, k, n, ElementType::Bf16), &CompileOptions::default())
            .unwrap();
        let out = program
            .execute(&[
                &upload(&client, &a, &[m as i64, k as i64]),
                &upload(&client, &b, &[k as i64, n as i64]),
            ])
            .unwrap();
        let got: Vec<f64> = out[0].to_host::<bf16>().unwrap().iter().map(|v| v.to_f64()).collect();
        let a64: Vec<f64> = a.iter().map(|v| v.to_f64()).collect();
        let b64: Vec<f64> = b.iter().map(|v| v.to_f64()).collect();
        let (want, scale) = matmul_f64(&a64, &b64, m, k, n);
        let error = worst_relative_error(&got, &want, &scale);
        // bf16 keeps 8 significant bits: the rounded result alone is off by up to 2^-9.
        assert!(error < 1e-2, "{} bf16: relative error {error}", client.platform_name());
        assert!(
            error > 0.0,
            "a bf16 result equal to f64 math everywhere means bf16 was not used"
        );
    }
}

#[test]
fn every_element_type_round_trips() {
    for client in clients() {
        let floats = random_f64(12);
        let dims = [3, 4];
        let f32s: Vec<f32> = floats.iter().map(|&v| v as f32).collect();
        assert_eq!(upload(&client, &f32s, &dims).to_host::<f32>().unwrap(), f32s);
        let f64s = floats.clone();
        assert_eq!(upload(&client, &f64s, &dims).to_host::<f64>().unwrap(), f64s);
        let bf16s: Vec<bf16> = floats.iter().map(|&v| bf16::from_f64(v)).collect();
        assert_eq!(upload(&client, &bf16s, &dims).to_host::<bf16>().unwrap(), bf16s);
        let f16s: Vec<f16> = floats.iter().map(|&v| f16::from_f64(v)).collect();
        assert_eq!(upload(&client, &f16s, &dims).to_host::<f16>().unwrap(), f16s);
        let i32s: Vec<i32> = floats.iter().map(|&v| (v * 1e9) as i32).collect();
        assert_eq!(upload(&client, &i32s, &dims).to_host::<i32>().unwrap(), i32s);
        let i64s: Vec<i64> = floats.iter().map(|&v| (v * 1e18) as i64).collect();
        assert_eq!(upload(&client, &i64s, &dims).to_host::<i64>().unwrap(), i64s);
        let u32s: Vec<u32> = floats.iter().map(|&v| (v.abs() * 4e9) as u32).collect();
        assert_eq!(upload(&client, &u32s, &dims).to_host::<u32>().unwrap(), u32s);
        let u8s: Vec<u8> = floats.iter().map(|&v| (v.abs() * 255.0) as u8).collect();
        assert_eq!(upload(&client, &u8s, &dims).to_host::<u8>().unwrap(), u8s);
        let preds: Vec<Pred> = floats.iter().map(|&v| Pred::from(v > 0.0)).collect();
        let buffer = upload(&client, &preds, &dims);
        assert_eq!(buffer.dtype(), grpo_xla::ElementType::Pred);
        assert_eq!(buffer.to_host::<Pred>().unwrap(), preds);

        let scalar = upload(&client, &[7i32], &[]);
        assert!(scalar.dims().is_empty());
        assert_eq!(scalar.to_host::<i32>().unwrap(), [7]);
        let empty = upload::<f32>(&client, &[], &[0, 5]);
        assert_eq!(empty.element_count(), 0);
        assert!(empty.to_host::<f32>().unwrap().is_empty());
    }
}

#[test]
fn host_data_errors_name_the_problem() {
    let client = cpu_client(1);
    let device = client.device(0).unwrap();
    let short = client
        .buffer_from_host(&[1.0f32, 2.0, 3.0], &[2, 2], device)
        .unwrap_err();
    assert!(
        matches!(
            short,
            Error::HostLength {
                expected: 4,
                found: 3,
                ..
            }
        ),
        "{short}"
    );
    let buffer = client.buffer_from_host(&[1.0f32, 2.0], &[2], device).unwrap();
    let wrong = buffer.to_host::<i32>().unwrap_err();
    assert!(wrong.to_string().contains("holds f32, read as s32"), "{wrong}");
    assert!(matches!(
        client.device(3),
        Err(Error::NoSuchDevice { index: 3, count: 1 })
    ));
}

#[test]
fn a_program_returns_several_outputs() {
    let client = cpu_client(1);
    let program = r#"module @sum_and_product {
  func.func public @main(%x: tensor<5xf32>, %y: tensor<5xf32>) -> (tensor<5xf32>, tensor<5xf32>, tensor<f32>) {
    %s = stablehlo.add %x, %y : tensor<5xf32>
    %p = stablehlo.multiply %x, %y : tensor<5xf32>
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %t = stablehlo.reduce(%p init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<5xf32>, tensor<f32>) -> tensor<f32>
    return %s, %p, %t : tensor<5xf32>, tensor<5xf32>, tensor<f32>
  }
}"#;
    let executable = client.compile(program, &CompileOptions::default()).unwrap();
    assert_eq!(executable.name(), "sum_and_product");
    assert_eq!(
        executable.output_types(),
        [
            TensorType::new(grpo_xla::ElementType::F32, [5]),
            TensorType::new(grpo_xla::ElementType::F32, [5]),
            TensorType::new(grpo_xla::ElementType::F32, [])
        ]
    );
    let x: Vec<f32> = random_f64(5).iter().map(|&v| v as f32).collect();
    let y: Vec<f32> = random_f64(5).iter().map(|&v| v as f32).collect();
    let out = executable
        .execute(&[&upload(&client, &x, &[5]), &upload(&client, &y, &[5])])
        .unwrap();
    assert_eq!(out.len(), 3);
    let sum = out[0].to_host::<f32>().unwrap();
    let product = out[1].to_host::<f32>().unwrap();
    let dot = out[2].to_host::<f32>().unwrap()[0];
    for i in 0..5 {
        assert_eq!(sum[i], x[i] + y[i]);
        assert_eq!(product[i], x[i] * y[i]);
    }
    let want: f64 = x.iter().zip(&y).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum();
    assert!((f64::from(dot) - want).abs() < 1e-6, "{dot} vs {want}");
}

#[test]
fn donated_input_becomes_the_output_and_is_unusable() {
    let client = cpu_client(1);
    let n = 1024;
    let executable = client
        .compile(&donating_add_program(n), &CompileOptions::default())
        .unwrap();
    assert!(executable.signature().parameters[0].donatable);
    let x: Vec<f32> = random_f64(n).iter().map(|&v| v as f32).collect();
    let y: Vec<f32> = random_f64(n).iter().map(|&v| v as f32).collect();
    let xb = upload(&client, &x, &[n as i64]);
    let yb = upload(&client, &y, &[n as i64]);

    // Borrowed, the donatable input survives and the output is new memory.
    let kept = executable.execute(&[&xb, &yb]).unwrap();
    assert!(!xb.is_deleted());
    assert_eq!(xb.to_host::<f32>().unwrap(), x);
    assert_ne!(kept[0].device_address().unwrap(), xb.device_address().unwrap());

    // Donated, the output reuses the input's memory and the input is gone.
    let address = xb.device_address().unwrap();
    let out = executable.execute_args(&[Arg::Donate(&xb), Arg::Borrow(&yb)]).unwrap();
    assert_eq!(
        out[0].device_address().unwrap(),
        address,
        "the output must alias the donated input"
    );
    assert!(xb.is_deleted());
    assert!(matches!(xb.to_host::<f32>(), Err(Error::BufferDeleted)));
    assert!(matches!(executable.execute(&[&xb, &yb]), Err(Error::BufferDeleted)));
    let sums = out[0].to_host::<f32>().unwrap();
    assert!(sums.iter().zip(x.iter().zip(&y)).all(|(s, (a, b))| *s == a + b));

    // A parameter without aliasing refuses donation; one buffer cannot be donated and borrowed.
    let z = upload(&client, &y, &[n as i64]);
    let not_donatable = executable
        .execute_args(&[Arg::Borrow(&out[0]), Arg::Donate(&z)])
        .unwrap_err();
    assert!(
        matches!(not_donatable, Error::NotDonatable { index: 1, .. }),
        "{not_donatable}"
    );
    let twice = executable
        .execute_args(&[Arg::Donate(&z), Arg::Borrow(&z)])
        .unwrap_err();
    assert!(matches!(twice, Error::DonatedTwice { index: 0, .. }), "{twice}");
    assert!(!z.is_deleted());
}

#[test]
fn a_program_reports_its_planned_memory() {
    let client = cpu_client(1);
    let (m, k, n) = (64, 128, 32);
    let matmul = client
        .compile(&matmul_program(m, k, n, ElementType::F32), &CompileOptions::default())
        .unwrap();
    let memory = matmul.memory_stats().unwrap();
    assert_eq!(memory.arguments, (m * k + k * n) * 4, "{memory:?}");
    assert_eq!(memory.outputs, m * n * 4, "{memory:?}");
    assert_eq!(memory.aliased, 0, "{memory:?}");
    let add = client
        .compile(&donating_add_program(1024), &CompileOptions::default())
        .unwrap();
    let memory = add.memory_stats().unwrap();
    assert_eq!((memory.arguments, memory.outputs), (2 * 4096, 4096), "{memory:?}");
    assert_eq!(memory.aliased, 4096, "the donated input is the output: {memory:?}");
}

#[test]
fn donation_keeps_live_memory_flat_over_many_steps() {
    let client = cpu_client(1);
    let n = 4096;
    let executable = client
        .compile(&donating_add_program(n), &CompileOptions::default())
        .unwrap();
    let ones = vec![1.0f32; n];
    let step = upload(&client, &ones, &[n as i64]);
    let mut state = upload(&client, &vec![0.0f32; n], &[n as i64]);
    let before = client.live_buffers();
    for _ in 0..50 {
        let mut out = executable
            .execute_args(&[Arg::Donate(&state), Arg::Borrow(&step)])
            .unwrap();
        state = out.pop().unwrap();
    }
    assert_eq!(client.live_buffers(), before);
    assert!(state.to_host::<f32>().unwrap().iter().all(|&v| v == 50.0));
}

#[test]
fn programs_run_on_each_of_four_virtual_devices() {
    let client = cpu_client(4);
    assert_eq!(client.devices().len(), 4);
    let (m, k, n) = (8, 16, 4);
    let text = matmul_program(m, k, n, ElementType::F32);
    for device in client.devices() {
        let executable = client.compile(&text, &CompileOptions::on_device(device)).unwrap();
        assert_eq!(executable.devices(), std::slice::from_ref(device));
        let a = random_f64(m * k);
        let b = random_f64(k * n);
        let a32: Vec<f32> = a.iter().map(|&v| v as f32).collect();
        let b32: Vec<f32> = b.iter().map(|&v| v as f32).collect();
        let ab = client.buffer_from_host(&a32, &[m as i64, k as i64], device).unwrap();
        let bb = client.buffer_from_host(&b32, &[k as i64, n as i64], device).unwrap();
        assert_eq!(ab.device(), device);
        let out = executable.execute(&[&ab, &bb]).unwrap();
        assert_eq!(out[0].device(), device);
        let got: Vec<f64> = out[0].to_host::<f32>().unwrap().iter().map(|&v| f64::from(v)).collect();
        let a64: Vec<f64> = a32.iter().map(|&v| f64::from(v)).collect();
        let b64: Vec<f64> = b32.iter().map(|&v| f64::from(v)).collect();
        let (want, scale) = matmul_f64(&a64, &b64, m, k, n);
        assert!(worst_relative_error(&got, &want, &scale) < 1e-5);

        // An argument on another device is refused before execution.
        let other = &client.devices()[(device.index() + 1) % 4];
        let elsewhere = ab.copy_to_device(other).unwrap();
        assert_eq!(elsewhere.to_host::<f32>().unwrap(), a32);
        let error = executable.execute(&[&elsewhere, &bb]).unwrap_err();
        assert!(matches!(error, Error::ArgumentDevice { index: 0, .. }), "{error}");
    }
}

#[test]
fn a_replicated_program_runs_on_all_devices_at_once() {
    let client = cpu_client(4);
    let n = 64;
    let executable = client
        .compile(&donating_add_program(n), &CompileOptions::replicated(client.devices()))
        .unwrap();
    assert_eq!(executable.devices().len(), 4);
    let inputs: Vec<(Vec<f32>, Buffer, Buffer)> = client
        .devices()
        .iter()
        .map(|device| {
            let x: Vec<f32> = random_f64(n).iter().map(|&v| v as f32).collect();
            let xb = client.buffer_from_host(&x, &[n as i64], device).unwrap();
            let yb = client.buffer_from_host(&x, &[n as i64], device).unwrap();
            (x, xb, yb)
        })
        .collect();
    let lists: Vec<Vec<Arg<'_>>> = inputs
        .iter()
        .map(|(_, x, y)| vec![Arg::Borrow(x), Arg::Borrow(y)])
        .collect();
    let list_refs: Vec<&[Arg<'_>]> = lists.iter().map(Vec::as_slice).collect();
    let outputs = executable.execute_replicated(&list_refs).unwrap();
    assert_eq!(outputs.len(), 4);
    for ((device, out), (x, _, _)) in client.devices().iter().zip(&outputs).zip(&inputs) {
        assert_eq!(out[0].device(), device);
        let doubled = out[0].to_host::<f32>().unwrap();
        assert!(doubled.iter().zip(x).all(|(d, v)| *d == v + v));
    }
    let too_few = executable.execute_replicated(&list_refs[..2]).unwrap_err();
    assert!(
        matches!(
            too_few,
            Error::DeviceCount {
                expected: 4,
                found: 2,
                ..
            }
        ),
        "{too_few}"
    );
}

#[test]
fn clients_and_executables_are_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Client>();
    assert_send_sync::<Buffer>();
    assert_send_sync::<grpo_xla::Executable>();

    let client = cpu_client(1);
    let executable = client
        .compile(&donating_add_program(256), &CompileOptions::default())
        .unwrap();
    std::thread::scope(|scope| {
        for t in 0..4 {
            let (client, executable) = (client.clone(), executable.clone());
            scope.spawn(move || {
                let device = client.device(0).unwrap();
                for i in 0..20 {
                    let value = (t * 100 + i) as f32;
                    let x = client.buffer_from_host(&[value; 256], &[256], device).unwrap();
                    let out = executable.execute(&[&x, &x]).unwrap();
                    assert!(out[0].to_host::<f32>().unwrap().iter().all(|&v| v == 2.0 * value));
                }
            });
        }
    });
}
