//! `grpo generate --model M --prompt TEXT`: completions from the rollout
//! engine. The prompt is tokenized as transformers' `tokenizer(text)` does;
//! `--chat` first renders it as a user turn with the chat template. With
//! `--json`, one line per sample: `{"text", "token_ids", "logprobs", "finish_reason"}`;
//! `--stop` ends a sample at a string (cut from its text).

use anyhow::{Context, bail};
use grpo_model::chat::ChatMessage;
use grpo_model::decoder::Decoder;
use grpo_model::load::upload_parameters;
use grpo_model::pretrained::Pretrained;
use grpo_rollout::engine::{Engine, EngineConfig};
use grpo_rollout::request::{Request, SamplingParams};
use grpo_xla::ElementType;

use crate::cli::adapter::{AdapterArgs, merged};
use crate::cli::platform::PlatformArgs;

/// Arguments of `grpo generate`.
#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    platform: PlatformArgs,
    /// A model folder, a .gguf file, or `smollm2-135m-instruct`.
    #[arg(long, default_value = "smollm2-135m-instruct")]
    model: String,
    #[command(flatten)]
    adapter: AdapterArgs,
    /// The prompt text.
    #[arg(long)]
    prompt: String,
    /// Render the prompt as a user message with the model's chat template.
    #[arg(long)]
    chat: bool,
    /// Samples of the prompt.
    #[arg(long, default_value_t = 1)]
    n: usize,
    /// Most new tokens per sample.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// 0 is greedy.
    #[arg(long, default_value_t = 1.0)]
    temperature: f32,
    /// Nucleus mass, in (0, 1].
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Keep only the k most likely tokens; 0 keeps all.
    #[arg(long, default_value_t = 0)]
    top_k: i32,
    /// Drop tokens below this fraction of the most likely one.
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    /// Seed of the first sample (the others derive theirs from it).
    #[arg(long, default_value_t = 0)]
    seed: u32,
    /// End a sample where its text contains this string (repeatable); the
    /// string is cut from the text.
    #[arg(long)]
    stop: Vec<String>,
    /// Keep generating past the end-of-sequence token.
    #[arg(long)]
    ignore_eos: bool,
    /// Print JSON lines instead of text.
    #[arg(long)]
    json: bool,
}

/// Generates and prints the samples.
pub fn run(args: &GenerateArgs) -> anyhow::Result<()> {
    if args.n == 0 {
        bail!("--n must be at least 1");
    }
    let model = Pretrained::open(&args.model)?;
    let adapter = args.adapter.read(&model.config)?;
    let tokenizer = model.tokenizer.as_ref().context("the model has no tokenizer")?;
    let text = if args.chat {
        let template = tokenizer.chat_template().context("the model has no chat template")?;
        let template = grpo_model::chat::ChatTemplate::new(template)?;
        let special = tokenizer.special_tokens();
        let token = |id: Option<u32>| id.and_then(|i| tokenizer.id_to_token(i)).unwrap_or_default();
        template.render(
            &[ChatMessage::new("user", &args.prompt)],
            true,
            &token(special.bos),
            &token(special.eos),
        )?
    } else {
        args.prompt.clone()
    };
    let prompt = tokenizer.encode(&text, true)?;
    let client = args.platform.client()?;
    let decoder = Decoder::new(model.config.clone());
    let weights = merged(model.weights.as_ref(), adapter.as_ref());
    let params = upload_parameters(&client, client.device(0)?, &decoder, weights.as_ref(), ElementType::F32)?;
    let max_model_len = (prompt.len() + args.max_tokens)
        .next_power_of_two()
        .min(model.config.max_positions);
    let config = EngineConfig {
        max_num_seqs: args.n.next_power_of_two(),
        max_model_len,
        dtype: ElementType::F32,
        ..EngineConfig::default()
    };
    let tokenizer = std::sync::Arc::new(tokenizer.clone());
    let mut engine = Engine::new(&client, decoder, params, config)?.with_tokenizer(tokenizer);
    let request = Request {
        prompt,
        params: SamplingParams {
            n: args.n,
            max_tokens: args.max_tokens,
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
            min_p: args.min_p,
            seed: args.seed,
            ignore_eos: args.ignore_eos,
            stop: args.stop.clone(),
            ..SamplingParams::default()
        },
    };
    for completion in engine.generate(&[request])?.remove(0) {
        let text = completion.text.clone().unwrap_or_default();
        let reason = completion.finish_reason.as_str();
        if args.json {
            let line = serde_json::json!({
                "text": text,
                "token_ids": completion.tokens,
                "logprobs": completion.logprobs,
                "finish_reason": reason,
            });
            println!("{line}");
        } else {
            println!("{text}");
        }
    }
    Ok(())
}
