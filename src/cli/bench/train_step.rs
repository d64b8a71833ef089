//! `grpo bench train-step`: one full training step (forward, MSE loss,
//! backward, clipping at 1.0, AdamW) compiled as one XLA program, timed as
//! `bench/train_step_torch.py` times PyTorch eager on the same shapes.
//!
//! Models (f32): `mlp` — x [2048, 512] → silu(x·W1 + b1)·W2 + b2, hidden
//! 2048; `block` — a Llama-style pre-norm transformer block without RoPE on
//! x [8, 256, 512]: RMSNorm, causal 8-head attention (head 64), residual,
//! RMSNorm, SwiGLU MLP (hidden 1408), residual.

use anyhow::bail;
use grpo_xla::trace::{AdamW, Mesh, Tensor, TrainStep, TrainStepSpec};
use grpo_xla::{Buffer, Client, ElementType, Result, ShardedBuffer, TensorType};
use rand::Rng;

use super::timing::TimingArgs;
use crate::cli::platform::PlatformArgs;

/// Arguments of `grpo bench train-step`.
#[derive(Debug, clap::Args)]
pub struct TrainStepArgs {
    #[command(flatten)]
    platform: PlatformArgs,
    /// Model: `mlp` or `block`.
    #[arg(long, default_value = "mlp")]
    model: String,
    #[command(flatten)]
    timing: TimingArgs,
}

const BATCH: i64 = 8;
const SEQ: i64 = 256;
const D_MODEL: i64 = 512;
const MLP_HIDDEN: i64 = 2048;
const HEADS: i64 = 8;
const HEAD_DIM: i64 = 64;
const FFN_HIDDEN: i64 = 1408;
const RMS_EPS: f64 = 1e-5;

/// A benchmark model: parameter shapes, batch shapes and the loss.
struct Model {
    params: Vec<Vec<i64>>,
    /// The value of every rank-1 parameter at the start (biases 0, norm weights 1);
    /// matrices start normal(0, 0.02), as in `bench/train_step_torch.py`.
    vector_init: f32,
    batch: Vec<Vec<i64>>,
    loss: fn(&[Tensor], &[Tensor]) -> Result<Tensor>,
}

fn mlp() -> Model {
    let rows = BATCH * SEQ;
    Model {
        params: vec![
            vec![D_MODEL, MLP_HIDDEN],
            vec![MLP_HIDDEN],
            vec![MLP_HIDDEN, D_MODEL],
            vec![D_MODEL],
        ],
        vector_init: 0.0,
        batch: vec![vec![rows, D_MODEL], vec![rows, D_MODEL]],
        loss: |p, b| {
            let hidden = b[0].matmul(&p[0])?.add(&p[1])?.silu()?;
            hidden.matmul(&p[2])?.add(&p[3])?.mse(&b[1])
        },
    }
}

fn block() -> Model {
    let square = vec![D_MODEL, D_MODEL];
    Model {
        params: vec![
            vec![D_MODEL],
            square.clone(),
            square.clone(),
            square.clone(),
            square,
            vec![D_MODEL],
            vec![D_MODEL, FFN_HIDDEN],
            vec![D_MODEL, FFN_HIDDEN],
            vec![FFN_HIDDEN, D_MODEL],
        ],
        vector_init: 1.0,
        batch: vec![vec![BATCH, SEQ, D_MODEL], vec![BATCH, SEQ, D_MODEL]],
        loss: |p, b| {
            let x = &b[0];
            let h = x.add(&attention(&x.rms_norm(&p[0], RMS_EPS)?, &p[1], &p[2], &p[3], &p[4])?)?;
            let n = h.rms_norm(&p[5], RMS_EPS)?;
            let ffn = n.matmul(&p[6])?.silu()?.mul(&n.matmul(&p[7])?)?.matmul(&p[8])?;
            h.add(&ffn)?.mse(&b[1])
        },
    }
}

/// Causal multi-head self-attention of `a` [B, S, D].
fn attention(a: &Tensor, wq: &Tensor, wk: &Tensor, wv: &Tensor, wo: &Tensor) -> Result<Tensor> {
    let heads = |w: &Tensor| -> Result<Tensor> {
        a.matmul(w)?
            .reshape(&[BATCH, SEQ, HEADS, HEAD_DIM])?
            .transpose(&[0, 2, 1, 3])
    };
    let (q, k, v) = (heads(wq)?, heads(wk)?, heads(wv)?);
    let scores = q.matmul(&k.t()?)?.mul_scalar(1.0 / (HEAD_DIM as f64).sqrt())?;
    let graph = a.graph();
    let dims = [SEQ, SEQ];
    let row = graph.iota(ElementType::S32, &dims, 0)?;
    let col = graph.iota(ElementType::S32, &dims, 1)?;
    let masked = col.gt(&row)?.select(&scores.full_like(f64::NEG_INFINITY)?, &scores)?;
    let context = masked.softmax(3)?.matmul(&v)?;
    context
        .transpose(&[0, 2, 1, 3])?
        .reshape(&[BATCH, SEQ, D_MODEL])?
        .matmul(wo)
}

/// Times the chosen model's training step and prints the result.
pub fn run(args: &TrainStepArgs) -> anyhow::Result<()> {
    let model = match args.model.as_str() {
        "mlp" => mlp(),
        "block" => block(),
        other => bail!("unknown model `{other}`: choose mlp or block"),
    };
    let client = args.platform.client()?;
    let f32_type = |dims: &Vec<i64>| TensorType::new(ElementType::F32, dims.clone());
    let optimizer = AdamW::default();
    let spec = TrainStepSpec {
        params: model.params.iter().map(f32_type).collect(),
        frozen: Vec::new(),
        batch: model.batch.iter().map(f32_type).collect(),
        optimizer: &optimizer,
        max_grad_norm: Some(1.0),
        accumulate: false,
        compute: ElementType::F32,
    };
    let mesh = Mesh::single(client.device(0)?);
    let loss = |params: &[Tensor], _: &[Tensor], batch: &[Tensor]| Ok(((model.loss)(params, batch)?, Vec::new()));
    let step = TrainStep::compile(&client, &spec, &mesh, loss)?;
    let params = model
        .params
        .iter()
        .map(|d| match d.len() {
            1 => client.buffer_from_host(&vec![model.vector_init; d[0] as usize], d, client.device(0)?),
            _ => normal_buffer(&client, d, 0.02),
        })
        .map(|buffer| buffer.map(ShardedBuffer::from))
        .collect::<Result<_>>()?;
    let mut state = step.init_state(params, Vec::new())?;
    let batch: Vec<ShardedBuffer> = model
        .batch
        .iter()
        .map(|d| Ok(normal_buffer(&client, d, 1.0)?.into()))
        .collect::<Result<_>>()?;
    let batch_refs = [batch.iter().collect()];
    let timings = args.timing.measure(|| {
        step.step(&mut state, &batch_refs, 1e-3)?;
        Ok(())
    })?;
    let (median, best) = (timings.median().as_secs_f64() * 1e3, timings.best().as_secs_f64() * 1e3);
    if args.timing.json {
        println!(
            "{{\"impl\": \"grpo\", \"model\": \"{}\", \"median_ms\": {median:.3}, \"best_ms\": {best:.3}, \"runs\": {}}}",
            args.model, args.timing.runs
        );
    } else {
        println!(
            "{} train step on {}: median {median:.1} ms, best {best:.1} ms over {} runs",
            args.model,
            client.platform_name(),
            args.timing.runs
        );
    }
    Ok(())
}

/// A buffer of normal(0, `std`) values (Box–Muller) on the first device.
fn normal_buffer(client: &Client, dims: &[i64], std: f32) -> Result<Buffer> {
    let mut rng = rand::rng();
    let count = dims.iter().product::<i64>() as usize;
    let values: Vec<f32> = (0..count)
        .map(|_| {
            let (u, v): (f32, f32) = (rng.random_range(f32::EPSILON..1.0), rng.random());
            std * (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
        })
        .collect();
    client.buffer_from_host(&values, dims, client.device(0)?)
}
