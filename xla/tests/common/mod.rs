//! Shared helpers of the runtime tests: clients on every available platform,
//! random host data, and small StableHLO programs.

#![allow(dead_code)]

use grpo_xla::{Client, ClientOptions, ElementType, Platform, Plugin};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::cell::RefCell;

/// A client of the CPU plugin with `devices` virtual devices and no disk cache.
///
/// Panics with the plugin search's message (which says to run `grpo setup`)
/// when no CPU plugin is installed: these tests must run on real XLA.
pub fn cpu_client(devices: usize) -> Client {
    let plugin = Plugin::find(Platform::Cpu).unwrap_or_else(|e| panic!("{e}"));
    let options = ClientOptions::default()
        .compile_cache_dir(None)
        .cpu_device_count(devices);
    Client::new(&plugin, options).unwrap_or_else(|e| panic!("{e}"))
}

/// A client per platform whose plugin is installed: always CPU, plus CUDA
/// and TPU where present, so every test also runs on an accelerator.
pub fn clients() -> Vec<Client> {
    let mut clients = vec![cpu_client(1)];
    for platform in [Platform::Cuda, Platform::Tpu] {
        if let Ok(plugin) = Plugin::find(platform) {
            let options = ClientOptions::default().compile_cache_dir(None);
            clients.push(Client::new(&plugin, options).unwrap_or_else(|e| panic!("{platform}: {e}")));
        }
    }
    clients
}

thread_local! {
    /// Each test runs on its own thread, so each test draws the same values on
    /// every run, whatever else runs beside it.
    static TEST_RNG: RefCell<StdRng> = RefCell::new(StdRng::seed_from_u64(test_seed()));
}

/// The seed of the tests' random data: `GRPO_TEST_SEED`, or 0.
fn test_seed() -> u64 {
    std::env::var("GRPO_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// `count` uniform values in [`low`, `high`) from this test's reproducible stream.
pub fn random_in(count: usize, low: f64, high: f64) -> Vec<f64> {
    TEST_RNG.with(|rng| {
        let mut rng = rng.borrow_mut();
        (0..count).map(|_| rng.random_range(low..high)).collect()
    })
}

/// `count` uniform values in [-1, 1) (see [`random_in`]).
pub fn random_f64(count: usize) -> Vec<f64> {
    random_in(count, -1.0, 1.0)
}

/// Row-major matrix product in f64: (m×k)·(k×n), and Σ|a||b| per element
/// (the scale of the rounding error any summation order can make).
pub fn matmul_f64(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut product = vec![0.0; m * n];
    let mut scale = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            for p in 0..k {
                product[i * n + j] += a[i * k + p] * b[p * n + j];
                scale[i * n + j] += (a[i * k + p] * b[p * n + j]).abs();
            }
        }
    }
    (product, scale)
}

/// StableHLO of `(m×k) · (k×n)` in `dtype`, as a `dot_general` in
/// generic syntax (written by hand: these tests check the runtime on
/// programs that do not come from the tracer).
pub fn matmul_program(m: usize, k: usize, n: usize, dtype: ElementType) -> String {
    let t = dtype.mlir_name();
    format!(
        r#"module @matmul_{m}x{k}x{n}_{t} {{
  func.func public @main(%a: tensor<{m}x{k}x{t}>, %b: tensor<{k}x{n}x{t}>) -> tensor<{m}x{n}x{t}> {{
    %c = "stablehlo.dot_general"(%a, %b) {{dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>}} : (tensor<{m}x{k}x{t}>, tensor<{k}x{n}x{t}>) -> tensor<{m}x{n}x{t}>
    return %c : tensor<{m}x{n}x{t}>
  }}
}}"#
    )
}

/// StableHLO of `x + y` over `n` f32 values; `x` may be donated to the output.
pub fn donating_add_program(n: usize) -> String {
    format!(
        r#"module @donating_add {{
  func.func public @main(%x: tensor<{n}xf32> {{tf.aliasing_output = 0 : i32}}, %y: tensor<{n}xf32>) -> tensor<{n}xf32> {{
    %z = stablehlo.add %x, %y : tensor<{n}xf32>
    return %z : tensor<{n}xf32>
  }}
}}"#
    )
}
pub mod check;
