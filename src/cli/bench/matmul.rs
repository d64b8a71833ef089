//! `grpo bench matmul`: the dot-product ceiling of the device, in GFLOP/s,
//! for each dtype and size: `2·n³` flops over the median time of one
//! `n×n · n×n` product (inputs already on the device, output awaited).

use anyhow::bail;
use grpo_xla::trace::Graph;
use grpo_xla::{Buffer, Client, ElementType, Executable};
use half::{bf16, f16};
use rand::Rng;

use super::timing::{TimingArgs, Timings};
use crate::cli::platform::PlatformArgs;

/// Arguments of `grpo bench matmul`.
#[derive(Debug, clap::Args)]
pub struct MatmulArgs {
    #[command(flatten)]
    platform: PlatformArgs,
    /// Matrix sizes n (each product is n×n · n×n).
    #[arg(long, value_delimiter = ',', default_value = "256,512,1024,2048")]
    sizes: Vec<usize>,
    /// Element types: any of f32, bf16, f16, f64.
    #[arg(long, value_delimiter = ',', default_value = "f32,bf16", value_parser = parse_dtype)]
    dtypes: Vec<ElementType>,
    #[command(flatten)]
    timing: TimingArgs,
}

fn parse_dtype(name: &str) -> Result<ElementType, String> {
    match name {
        "f32" => Ok(ElementType::F32),
        "bf16" => Ok(ElementType::Bf16),
        "f16" => Ok(ElementType::F16),
        "f64" => Ok(ElementType::F64),
        other => Err(format!("`{other}` is not a float type: choose f32, bf16, f16 or f64")),
    }
}

/// Measures every (dtype, size) and prints a table (or JSON lines).
pub fn run(args: &MatmulArgs) -> anyhow::Result<()> {
    if args.sizes.contains(&0) {
        bail!("--sizes must be positive");
    }
    let client = args.platform.client()?;
    let device_kind = client.devices().first().map_or("?", |d| d.kind());
    if !args.timing.json {
        println!(
            "matmul on {} ({device_kind}), {} timed runs after {} warm-up, median and best",
            client.platform_name(),
            args.timing.runs,
            args.timing.warmup
        );
        println!(
            "{:<6} {:>6} {:>12} {:>12} {:>14} {:>12}",
            "dtype", "n", "median ms", "best ms", "GFLOP/s med", "GFLOP/s best"
        );
    }
    for &dtype in &args.dtypes {
        for &n in &args.sizes {
            let timings = time_matmul(&client, dtype, n, args)?;
            let flops = 2.0 * (n as f64).powi(3);
            let rate = |d: std::time::Duration| flops / d.as_secs_f64() / 1e9;
            let (median, best) = (timings.median().as_secs_f64() * 1e3, timings.best().as_secs_f64() * 1e3);
            if args.timing.json {
                println!(
                    "{{\"dtype\": \"{dtype}\", \"n\": {n}, \"median_ms\": {median:.4}, \"best_ms\": {best:.4}, \"gflops\": {:.4}}}",
                    rate(timings.median())
                );
            } else {
                println!(
                    "{:<6} {n:>6} {median:>12.3} {best:>12.3} {:>14} {:>12}",
                    dtype.to_string(),
                    shown(rate(timings.median())),
                    shown(rate(timings.best()))
                );
            }
        }
    }
    if !args.timing.json {
        let stats = client.compile_stats();
        println!(
            "programs: {} compiled, {} loaded from the disk cache",
            stats.compiles, stats.disk_hits
        );
    }
    Ok(())
}

fn time_matmul(client: &Client, dtype: ElementType, n: usize, args: &MatmulArgs) -> anyhow::Result<Timings> {
    let executable = matmul(client, dtype, n)?;
    let a = random_matrix(client, dtype, n)?;
    let b = random_matrix(client, dtype, n)?;
    args.timing.measure(|| {
        let out = executable.execute(&[&a, &b])?;
        out[0].block_until_ready()?;
        Ok(())
    })
}

/// `n×n · n×n` in `dtype`, traced and compiled.
fn matmul(client: &Client, dtype: ElementType, n: usize) -> anyhow::Result<Executable> {
    let graph = Graph::new(&format!("matmul_{n}"));
    let dims = [n as i64, n as i64];
    let product = graph.parameter(dtype, &dims)?.matmul(&graph.parameter(dtype, &dims)?)?;
    Ok(graph.build(&[&product])?.compile(client)?)
}

/// An n×n matrix of uniform values in [-1, 1) on the first device.
fn random_matrix(client: &Client, dtype: ElementType, n: usize) -> anyhow::Result<Buffer> {
    let mut rng = rand::rng();
    let values: Vec<f32> = (0..n * n).map(|_| rng.random_range(-1.0..1.0)).collect();
    let dims = [n as i64, n as i64];
    let device = client.device(0)?;
    Ok(match dtype {
        ElementType::F32 => client.buffer_from_host(&values, &dims, device)?,
        ElementType::Bf16 => {
            let values: Vec<bf16> = values.iter().map(|&v| bf16::from_f32(v)).collect();
            client.buffer_from_host(&values, &dims, device)?
        }
        ElementType::F16 => {
            let values: Vec<f16> = values.iter().map(|&v| f16::from_f32(v)).collect();
            client.buffer_from_host(&values, &dims, device)?
        }
        ElementType::F64 => {
            let values: Vec<f64> = values.iter().map(|&v| f64::from(v)).collect();
            client.buffer_from_host(&values, &dims, device)?
        }
        other => bail!("matmul benchmark has no {other} inputs"),
    })
}

/// A rate for the table: one decimal, or four below 10
/// GFLOP/s (a tiny product's rate would otherwise print as 0.0).
fn shown(gflops: f64) -> String {
    if gflops < 10.0 {
        format!("{gflops:.4}")
    } else {
        format!("{gflops:.1}")
    }
}
