//! `grpo bench moe`: forward + backward of one sparse MLP layer (router,
//! top-k, the experts' SwiGLU, the weighted sum; gradients of the tokens,
//! the router and every expert) as one XLA program, once with the grouped
//! expert product and once computing every expert for every token, in the
//! same run on the same random tokens and weights. It prints both medians,
//! their ratio, and the largest difference between the two outputs.

use anyhow::bail;
use grpo_model::load::upload_values;
use grpo_model::moe::{ExpertProduct, ExpertWeights, blocks, grouped_experts, route, sparse_mlp};
use grpo_xla::trace::{Graph, Tensor, grad};
use grpo_xla::{Buffer, Client, ElementType, Executable};
use rand::Rng;

use super::timing::TimingArgs;
use crate::cli::platform::PlatformArgs;

/// Arguments of `grpo bench moe`.
#[derive(Debug, clap::Args)]
pub struct MoeArgs {
    #[command(flatten)]
    platform: PlatformArgs,
    /// Tokens routed through the layer.
    #[arg(long, default_value_t = 2048)]
    tokens: i64,
    /// Width of the tokens.
    #[arg(long, default_value_t = 576)]
    hidden: i64,
    /// Width of each expert's SwiGLU hidden layer.
    #[arg(long, default_value_t = 768)]
    inner: i64,
    /// Experts in the layer.
    #[arg(long, default_value_t = 8)]
    experts: i64,
    /// Experts each token is routed to.
    #[arg(long, default_value_t = 2)]
    top_k: usize,
    /// Rows per expert block of the grouped product (a power of two; default: the cost model's choice).
    #[arg(long)]
    block: Option<i64>,
    /// Tokens and weights dtype: f32 or bf16.
    #[arg(long, default_value = "f32")]
    dtype: String,
    #[command(flatten)]
    timing: TimingArgs,
}

/// `--expert-product`'s value as the decoder's setting.
pub fn expert_product(name: &str) -> anyhow::Result<ExpertProduct> {
    Ok(match name {
        "auto" => ExpertProduct::Auto,
        "grouped" => ExpertProduct::Grouped,
        "dense" => ExpertProduct::Dense,
        other => bail!("--expert-product must be auto, grouped or dense, not `{other}`"),
    })
}

/// Times both products and prints them with their ratio.
pub fn run(args: &MoeArgs) -> anyhow::Result<()> {
    let dtype = match args.dtype.as_str() {
        "f32" => ElementType::F32,
        "bf16" => ElementType::Bf16,
        other => bail!("--dtype must be f32 or bf16, not `{other}`"),
    };
    if args.tokens < 1 || args.hidden < 1 || args.inner < 1 || args.experts < 1 {
        bail!("--tokens, --hidden, --inner and --experts must be at least 1");
    }
    if args.top_k == 0 || args.top_k as i64 > args.experts {
        bail!("--top-k must be between 1 and --experts ({})", args.experts);
    }
    let client = args.platform.client()?;
    let device = client.device(0)?.clone();
    let (n, h, i, e) = (args.tokens, args.hidden, args.inner, args.experts);
    let shapes: [Vec<i64>; 5] = [vec![n, h], vec![e, h], vec![e, i, h], vec![e, i, h], vec![e, h, i]];
    let mut rng = rand::rng();
    let inputs = shapes
        .iter()
        .enumerate()
        .map(|(k, dims)| {
            // Tokens of unit scale, weights as transformers initializes them.
            let scale = if k == 0 { 1.0 } else { 0.02 };
            let count: i64 = dims.iter().product();
            let values: Vec<f32> = (0..count).map(|_| scale * (rng.random::<f32>() * 2.0 - 1.0)).collect();
            Ok(upload_values(&client, &device, &values, dims, dtype)?)
        })
        .collect::<anyhow::Result<Vec<Buffer>>>()?;
    let args_of: Vec<&Buffer> = inputs.iter().collect();

    let assignments = n * args.top_k as i64;
    let block = args.block.unwrap_or(grpo_model::moe::block_rows(assignments, e));
    if block < 1 {
        bail!("--block must be at least 1");
    }
    let case = format!(
        "{n} tokens × {h} → {e} experts of {i} (top {}), {}; grouped in {} blocks of {block} rows",
        args.top_k,
        args.dtype,
        blocks(assignments, e, block)
    );
    let mut results = Vec::new();
    for product in [ExpertProduct::Grouped, ExpertProduct::Dense] {
        let executable = compile(&client, &shapes, dtype, args.top_k, (product, block))?;
        let out = executable.execute(&args_of)?;
        let first: Vec<f32> = out[0].to_host::<f32>()?;
        let timings = args.timing.measure(|| {
            for output in executable.execute(&args_of)? {
                output.block_until_ready()?;
            }
            Ok(())
        })?;
        results.push((product, timings.median().as_secs_f64() * 1e3, first));
    }
    let difference = results[0]
        .2
        .iter()
        .zip(&results[1].2)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    let (grouped, dense) = (results[0].1, results[1].1);
    if args.timing.json {
        println!(
            "{{\"tokens\": {n}, \"hidden\": {h}, \"inner\": {i}, \"experts\": {e}, \"top_k\": {}, \"dtype\": \"{}\", \"block\": {block}, \"grouped_ms\": {grouped:.3}, \"dense_ms\": {dense:.3}, \"speedup\": {:.3}, \"max_output_difference\": {difference:e}, \"runs\": {}}}",
            args.top_k,
            args.dtype,
            dense / grouped,
            args.timing.runs
        );
    } else {
        println!(
            "{case}: grouped {grouped:.1} ms, dense {dense:.1} ms (medians of {}), grouped {:.2}× faster; outputs differ by ≤ {difference:e}",
            args.timing.runs,
            dense / grouped
        );
    }
    Ok(())
}

/// The layer's forward + backward program: outputs `[N, hidden]` and the
/// gradients of `Σ out²/2` with respect to the tokens, the router and each
/// stacked expert matrix.
fn compile(
    client: &Client,
    shapes: &[Vec<i64>; 5],
    dtype: ElementType,
    top_k: usize,
    (product, block): (ExpertProduct, i64),
) -> anyhow::Result<Executable> {
    let graph = Graph::new("moe_layer");
    let params = shapes
        .iter()
        .map(|dims| graph.parameter(dtype, dims))
        .collect::<grpo_xla::Result<Vec<Tensor>>>()?;
    let routing = route(&params[0], &params[1], top_k, true)?;
    let weights = ExpertWeights {
        gate: &params[2],
        up: &params[3],
        down: &params[4],
    };
    let out = match product {
        ExpertProduct::Grouped => grouped_experts(&params[0], &routing, &weights, block)?,
        _ => sparse_mlp(&params[0], &routing, &weights, product)?,
    }
    .convert(ElementType::F32)?;
    let loss = out.square()?.sum_all()?.mul_scalar(0.5)?;
    let wrt: Vec<&Tensor> = params.iter().collect();
    let grads = grad(&loss, &wrt)?;
    let mut outputs = vec![&out];
    outputs.extend(grads.iter());
    Ok(graph.build(&outputs)?.compile(client)?)
}
