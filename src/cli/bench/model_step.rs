//! `grpo bench model-step`: training forward + backward of a pretrained
//! decoder (loss = −mean next-token log-prob, gradients of every parameter,
//! no optimizer) as one XLA program, timed as `bench/model_step_torch.py`
//! times transformers on the same model and shapes.

use anyhow::bail;
use grpo_model::decoder::Decoder;
use grpo_model::load::upload_parameters;
use grpo_model::pretrained::Pretrained;
use grpo_xla::trace::{Graph, Tensor, grad};
use grpo_xla::{Buffer, ElementType, Pred};
use rand::Rng;

use super::timing::TimingArgs;
use crate::cli::platform::PlatformArgs;

/// Arguments of `grpo bench model-step`.
#[derive(Debug, clap::Args)]
pub struct ModelStepArgs {
    #[command(flatten)]
    platform: PlatformArgs,
    /// A model folder, a .gguf file, or `smollm2-135m-instruct`.
    #[arg(long, default_value = "smollm2-135m-instruct")]
    model: String,
    /// Sequences per step.
    #[arg(long, default_value_t = 8)]
    batch: i64,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 256)]
    seq: i64,
    /// Parameter dtype: f32 or bf16.
    #[arg(long, default_value = "f32")]
    dtype: String,
    #[command(flatten)]
    timing: TimingArgs,
}

/// Compiles and times the forward + backward program.
pub fn run(args: &ModelStepArgs) -> anyhow::Result<()> {
    let dtype = match args.dtype.as_str() {
        "f32" => ElementType::F32,
        "bf16" => ElementType::Bf16,
        other => bail!("--dtype must be f32 or bf16, not `{other}`"),
    };
    if args.batch < 1 || args.seq < 2 {
        bail!("--batch must be ≥ 1 and --seq ≥ 2");
    }
    let model = Pretrained::open(&args.model)?;
    let client = args.platform.client()?;
    let device = client.device(0)?.clone();
    let decoder = Decoder::new(model.config.clone());
    let params = upload_parameters(&client, &device, &decoder, model.weights.as_ref(), dtype)?;

    let graph = Graph::new("model_step");
    let inputs = decoder.parameter_tensors(&graph, dtype)?;
    let ids = graph.parameter(ElementType::S32, &[args.batch, args.seq])?;
    let mask = graph.parameter(ElementType::Pred, &[args.batch, args.seq])?;
    let (logprobs, _) = decoder.token_logprobs(&inputs, &ids, &mask, args.seq - 1, 1.0)?;
    let loss = logprobs.mean(&[0, 1])?.neg()?;
    let wrt: Vec<&Tensor> = inputs.iter().collect();
    let grads = grad(&loss, &wrt)?;
    let mut outputs = vec![&loss];
    outputs.extend(grads.iter());
    let executable = graph.build(&outputs)?.compile(&client)?;

    let mut rng = rand::rng();
    let count = (args.batch * args.seq) as usize;
    let vocab = model.config.vocab_size as i32;
    let token_ids: Vec<i32> = (0..count).map(|_| rng.random_range(0..vocab)).collect();
    let dims = [args.batch, args.seq];
    let ids = client.buffer_from_host(&token_ids, &dims, &device)?;
    let mask = client.buffer_from_host(&vec![Pred::from(true); count], &dims, &device)?;
    let mut call: Vec<&Buffer> = params.iter().collect();
    call.push(&ids);
    call.push(&mask);
    let timings = args.timing.measure(|| {
        for output in executable.execute(&call)? {
            output.block_until_ready()?;
        }
        Ok(())
    })?;
    let (median, best) = (timings.median().as_secs_f64() * 1e3, timings.best().as_secs_f64() * 1e3);
    if args.timing.json {
        println!(
            "{{\"impl\": \"grpo\", \"model\": \"{}\", \"dtype\": \"{}\", \"batch\": {}, \"seq\": {}, \"median_ms\": {median:.3}, \"best_ms\": {best:.3}, \"runs\": {}}}",
            model_label(&args.model),
            args.dtype,
            args.batch,
            args.seq,
            args.timing.runs
        );
    } else {
        let tokens = count as f64 / (median / 1e3);
        println!(
            "{} {} fwd+bwd at {}×{}: median {median:.1} ms ({tokens:.0} tokens/s), best {best:.1} ms",
            args.model, args.dtype, args.batch, args.seq
        );
    }
    Ok(())
}

/// The label the report groups by (`smollm2-135m` for the bundled model).
fn model_label(spec: &str) -> &str {
    if spec == grpo_model::bundled::SMOLLM2_NAME {
        "smollm2-135m"
    } else {
        spec
    }
}
