//! `grpo bench model-step`: training forward + backward of a pretrained
//! decoder (loss = −mean next-token log-prob, gradients of every parameter,
//! no optimizer) as one XLA program, timed as `bench/model_step_torch.py`
//! times transformers on the same model and shapes. It reports the memory
//! XLA's buffer assignment gives the program — temporaries (activations and
//! the backward's intermediates), arguments, outputs — with or without
//! layer checkpoints; `--compile-only` stops there, to find the longest
//! row a machine holds without running it.

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
    /// `none`, or `layer`: each decoder layer keeps its input alone and is
    /// computed again in the backward pass (`[trainer] activation_checkpointing`).
    #[arg(long, default_value = "none")]
    activation_checkpointing: String,
    /// How sparse (mixture-of-experts) layers multiply tokens by experts:
    /// `auto`, `grouped` or `dense` (see `grpo bench moe`).
    #[arg(long, default_value = "auto")]
    expert_product: String,
    /// Compile and report the program's memory, without running it.
    #[arg(long)]
    compile_only: bool,
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
    let checkpoints = match args.activation_checkpointing.as_str() {
        "none" => false,
        "layer" => true,
        other => bail!("--activation-checkpointing must be none or layer, not `{other}`"),
    };
    let model = Pretrained::open(&args.model)?;
    let client = args.platform.client()?;
    let device = client.device(0)?.clone();
    let decoder = Decoder::new(model.config.clone())
        .with_layer_checkpoints(checkpoints)
        .with_expert_product(super::moe::expert_product(&args.expert_product)?);

    let graph = Graph::new("model_step");
    let inputs = decoder.parameter_tensors(&graph, dtype)?;
    let ids = graph.parameter(ElementType::S32, &[args.batch, args.seq])?;
    let mask = graph.parameter(ElementType::Pred, &[args.batch, args.seq])?;
    let scores = decoder.token_logprobs(&inputs, &ids, &mask, args.seq - 1, 1.0)?;
    let loss = scores.logprobs.mean(&[0, 1])?.neg()?;
    let wrt: Vec<&Tensor> = inputs.iter().collect();
    let grads = grad(&loss, &wrt)?;
    let mut outputs = vec![&loss];
    outputs.extend(grads.iter());
    let executable = graph.build(&outputs)?.compile(&client)?;
    let memory = executable.memory_stats()?;
    let gib = |bytes: usize| bytes as f64 / f64::from(1u32 << 30);
    let case_json = format!(
        "\"impl\": \"grpo\", \"model\": \"{}\", \"dtype\": \"{}\", \"batch\": {}, \"seq\": {}, \"expert_product\": \"{}\"",
        model_label(&args.model),
        args.dtype,
        args.batch,
        args.seq,
        args.expert_product
    );
    let case_text = format!("{} {} fwd+bwd at {}×{}", args.model, args.dtype, args.batch, args.seq);
    let memory_json = format!(
        "\"activation_checkpointing\": \"{}\", \"temp_bytes\": {}, \"argument_bytes\": {}, \"output_bytes\": {}, \"peak_bytes\": {}",
        args.activation_checkpointing, memory.temporaries, memory.arguments, memory.outputs, memory.peak
    );
    let memory_text = format!(
        "temporaries {:.3} GiB, arguments {:.3} GiB, outputs {:.3} GiB (activation checkpointing: {})",
        gib(memory.temporaries),
        gib(memory.arguments),
        gib(memory.outputs),
        args.activation_checkpointing
    );
    if args.compile_only {
        if args.timing.json {
            println!("{{{case_json}, {memory_json}}}");
        } else {
            println!("{case_text}: {memory_text}");
        }
        return Ok(());
    }
    let params = upload_parameters(&client, &device, &decoder, model.weights.as_ref(), dtype)?;

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
    let rss = grpo_learner::run::peak_resident_bytes().unwrap_or(0);
    if args.timing.json {
        println!(
            "{{{case_json}, \"median_ms\": {median:.3}, \"best_ms\": {best:.3}, \"runs\": {}, {memory_json}, \"peak_rss_bytes\": {rss}}}",
            args.timing.runs
        );
    } else {
        let tokens = count as f64 / (median / 1e3);
        println!(
            "{case_text}: median {median:.1} ms ({tokens:.0} tokens/s), best {best:.1} ms; {memory_text}; peak RSS {:.3} GiB",
            gib(rss as usize)
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
