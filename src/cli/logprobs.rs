//! `grpo logprobs --model M [--adapter A] --input FILE.jsonl`: for each input line, the
//! log-probability of every completion token given the prompt and the
//! completion tokens before it, as one JSON line `{"logprobs": [...]}`.
//!
//! Input lines are `{"prompt_ids": [...], "completion_ids": [...]}` or
//! `{"prompt": "...", "completion": "..."}` (text is tokenized as
//! transformers' `tokenizer(text)` does, each part on its own).

use std::io::{BufRead, Write};
use std::path::PathBuf;

use anyhow::{Context, bail};
use grpo_model::decoder::Decoder;
use grpo_model::load::upload_parameters;
use grpo_model::logprobs::LogprobsRunner;
use grpo_model::pretrained::Pretrained;
use grpo_model::tokenizer::Tokenizer;
use grpo_xla::ElementType;
use serde_json::Value;

use crate::cli::adapter::{AdapterArgs, merged};
use crate::cli::platform::PlatformArgs;

/// Lines scored together in one batch.
const BATCH: usize = 8;

/// Arguments of `grpo logprobs`.
#[derive(Debug, clap::Args)]
pub struct LogprobsArgs {
    #[command(flatten)]
    platform: PlatformArgs,
    /// A model folder, a .gguf file, or `smollm2-135m-instruct`.
    #[arg(long)]
    model: String,
    #[command(flatten)]
    adapter: AdapterArgs,
    /// JSONL input, one request per line.
    #[arg(long)]
    input: PathBuf,
    /// Parameter dtype: f32 or bf16.
    #[arg(long, default_value = "f32")]
    dtype: String,
}

/// Scores every line and prints one output line per input line, in order.
pub fn run(args: &LogprobsArgs) -> anyhow::Result<()> {
    let dtype = match args.dtype.as_str() {
        "f32" => ElementType::F32,
        "bf16" => ElementType::Bf16,
        other => bail!("--dtype must be f32 or bf16, not `{other}`"),
    };
    let model = Pretrained::open(&args.model)?;
    let adapter = args.adapter.read(&model.config)?;
    let requests = read_requests(&args.input, model.tokenizer.as_ref())?;
    let client = args.platform.client()?;
    let device = client.device(0)?.clone();
    let decoder = Decoder::new(model.config.clone());
    let weights = merged(model.weights.as_ref(), adapter.as_ref());
    let params = upload_parameters(&client, &device, &decoder, weights.as_ref(), dtype)?;
    let runner = LogprobsRunner::new(&client, decoder, dtype);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for chunk in requests.chunks(BATCH) {
        let sequences: Vec<Vec<u32>> = chunk
            .iter()
            .map(|(p, c)| [p.as_slice(), c.as_slice()].concat())
            .collect();
        let stats = runner.run(&params, &sequences)?;
        for ((prompt, completion), stat) in chunk.iter().zip(stats) {
            let start = prompt.len() - 1;
            let logprobs = &stat.logprobs[start..start + completion.len()];
            writeln!(out, "{}", serde_json::json!({ "logprobs": logprobs }))?;
        }
    }
    Ok(())
}

/// (prompt ids, completion ids) per line; errors name the line.
fn read_requests(path: &PathBuf, tokenizer: Option<&Tokenizer>) -> anyhow::Result<Vec<(Vec<u32>, Vec<u32>)>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut requests = Vec::new();
    for (number, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("reading {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{}:{}", path.display(), number + 1);
        let value: Value = serde_json::from_str(&line).with_context(|| format!("{}: not JSON", at()))?;
        let part = |ids_key: &str, text_key: &str| -> anyhow::Result<Vec<u32>> {
            if let Some(ids) = value.get(ids_key) {
                return ids
                    .as_array()
                    .and_then(|a| {
                        a.iter()
                            .map(|v| v.as_u64().map(|n| n as u32))
                            .collect::<Option<Vec<_>>>()
                    })
                    .with_context(|| format!("{}: `{ids_key}` must be a list of token ids", at()));
            }
            let text = value
                .get(text_key)
                .and_then(Value::as_str)
                .with_context(|| format!("{}: needs `{ids_key}` or `{text_key}`", at()))?;
            let tokenizer =
                tokenizer.with_context(|| format!("{}: text input needs a model with a tokenizer", at()))?;
            Ok(tokenizer.encode(text, true)?)
        };
        let (prompt, completion) = (part("prompt_ids", "prompt")?, part("completion_ids", "completion")?);
        if prompt.is_empty() || completion.is_empty() {
            bail!("{}: the prompt and the completion each need at least one token", at());
        }
        requests.push((prompt, completion));
    }
    Ok(requests)
}
