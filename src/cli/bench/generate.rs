//! `grpo bench generate`: prefill and decode throughput of the rollout
//! engine on a pretrained model, timed as `bench/generate_torch.py` times
//! transformers' `generate` on the same prompt ids, dtype and batches.
//!
//! Per batch B: B copies of one prompt (a fixed English text tokenized and
//! cut to exactly `--prompt-tokens` ids), greedy (or sampled at
//! `--temperature`, request `i` with seed `i`), EOS ignored, through an
//! engine with B slots and a `max_model_len` of the next power of two above
//! prompt + 1 + new tokens. Each run calls `generate` twice; `--warmup`
//! untimed runs (the first compiles the programs), then the medians of
//! `--runs` timed ones:
//!
//! - `t1`: `generate` with `max_tokens` 1 — the prefill of all B prompts and
//!   the first token; prefill tokens/s = B·prompt / t1;
//! - `t`: `generate` with `max_tokens` 1 + new; decode tokens/s =
//!   B·new / (t − t1).
//!
//! With `--json-schema FILE` every request is guided by that schema (see
//! `grpo_rollout::guided`), EOS no longer ignored: the schema must make
//! answers longer than `--new-tokens` (an array with many required items),
//! so that every sample still runs to the end and the runs differ from the
//! unguided ones by the guide's work alone — its masks on the host
//! (reported as a share of the decode time) and the masked decode program.
//!
//! With `--loras N` the engine serves N random LoRA adapters of rank
//! `--lora-rank` on every linear layer side by side (`max_loras` = N), and
//! request `i` of a batch uses adapter `i mod N`: what a batch mixing
//! adapters costs against the base model's (`--loras 0`, the default).
//!
//! The batch-1 bandwidth limit is the measured host copy bandwidth over the
//! bytes of all parameters in the chosen dtype (every weight is read once per
//! decoded token; the tied embedding is the lm_head matrix). The bandwidth is
//! the median of several single-threaded `copy_from_slice` of a 512 MiB
//! buffer, counting the bytes read and written: a copy of N bytes moves 2N.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use grpo_model::decoder::Decoder;
use grpo_model::load::upload_parameters;
use grpo_model::lora::{LoraConfig, Targets, new_adapters};
use grpo_model::pretrained::Pretrained;
use grpo_model::tokenizer::Tokenizer;
use grpo_rollout::engine::{Engine, EngineConfig};
use grpo_rollout::guided::Guide;
use grpo_rollout::output::Completion;
use grpo_rollout::request::{Request, SamplingParams};
use grpo_xla::ElementType;

use super::timing::{TimingArgs, Timings};
use crate::cli::platform::PlatformArgs;

/// The prompt: repeated until it gives enough tokens, then cut.
const PROMPT_TEXT: &str = "The old lighthouse keeper climbed the spiral stairs every evening at dusk, \
    carrying a small brass lantern and a notebook in which he wrote down the weather, the ships he had \
    seen and the birds that rested on the railing. Over forty years the notebooks filled a whole shelf, \
    and the people of the village came to read them when they wanted to know how the sea had behaved \
    in the winters of their childhood.";

/// Size of each buffer of the copy-bandwidth measurement.
const COPY_BYTES: usize = 512 << 20;
/// Timed copies (after one untimed); the median is the bandwidth.
const COPY_RUNS: usize = 7;

/// Arguments of `grpo bench generate`.
#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    platform: PlatformArgs,
    /// A model folder, a .gguf file, or `smollm2-135m-instruct`.
    #[arg(long, default_value = "smollm2-135m-instruct")]
    model: String,
    /// Batch sizes: B requests decoded together by an engine with B slots.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    batch: Vec<usize>,
    /// Decode tokens timed per request (each request generates one more: the prefill's).
    #[arg(long, default_value_t = 64)]
    new_tokens: usize,
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 64)]
    prompt_tokens: usize,
    /// Parameter and KV-cache dtype: f32 or bf16.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Sampling temperature: 0 decodes greedily; above, every request
    /// samples from the whole vocabulary (no top-k, top-p or min-p), each
    /// with its own seed, as GRPO's rollouts do.
    #[arg(long, default_value_t = 0.0, value_parser = parse_temperature)]
    temperature: f32,
    /// Write the prompt ids and, per batch, the tokens of its first
    /// request (greedy ones at temperature 0) as JSON here (for
    /// `bench/generate_torch.py --tokens`).
    #[arg(long)]
    tokens_out: Option<PathBuf>,
    /// Guide every request by the JSON schema in this file (structured
    /// outputs); its answers must outlast `--new-tokens`.
    #[arg(long)]
    json_schema: Option<PathBuf>,
    /// Random LoRA adapters on every linear layer the engine serves side by
    /// side; request i of a batch uses adapter i mod N (0: the base model).
    #[arg(long, default_value_t = 0, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=64))]
    loras: usize,
    /// The adapters' rank.
    #[arg(long, default_value_t = 16, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024))]
    lora_rank: usize,
    #[command(flatten)]
    timing: TimingArgs,
}

/// Measures every batch size and prints a line each.
pub fn run(args: &GenerateArgs) -> anyhow::Result<()> {
    let dtype = match args.dtype.as_str() {
        "f32" => ElementType::F32,
        "bf16" => ElementType::Bf16,
        other => bail!("--dtype must be f32 or bf16, not `{other}`"),
    };
    if args.batch.is_empty() || args.batch.contains(&0) {
        bail!("--batch must list batch sizes ≥ 1");
    }
    if args.prompt_tokens == 0 || args.new_tokens == 0 {
        bail!("--prompt-tokens and --new-tokens must be ≥ 1");
    }
    let model = Pretrained::open(&args.model)?;
    let tokenizer = std::sync::Arc::new(model.tokenizer.clone().context("the model has no tokenizer")?);
    let prompt = prompt_ids(&tokenizer, args.prompt_tokens)?;
    let needed = args.prompt_tokens + 1 + args.new_tokens;
    if needed > model.config.max_positions {
        bail!(
            "prompt + 1 + new tokens = {needed} exceeds the model's {} positions",
            model.config.max_positions
        );
    }
    let max_model_len = needed.next_power_of_two().min(model.config.max_positions);

    let decoder = Decoder::new(model.config.clone());
    let weight_bytes: usize = decoder
        .parameters()
        .iter()
        .map(|p| p.dims.iter().product::<usize>() * dtype.byte_size())
        .sum();
    let bandwidth = copy_bandwidth(COPY_BYTES, COPY_RUNS)?;
    let limit = bandwidth / weight_bytes as f64;
    let runs = args.timing.runs.max(1);
    if !args.timing.json {
        println!(
            "{} {}: {:.1} MB of weights; copy bandwidth {:.1} GB/s (copy_from_slice of {} MiB, read + written) \
             → batch-1 decode limit {limit:.1} tokens/s; prompt {} tokens, {} new, {} timed runs after {} warm-up",
            args.model,
            args.dtype,
            weight_bytes as f64 / 1e6,
            bandwidth / 1e9,
            COPY_BYTES >> 20,
            args.prompt_tokens,
            args.new_tokens,
            runs,
            args.timing.warmup
        );
    }

    if args.loras > 0 && !args.timing.json {
        println!(
            "{} LoRA adapters of rank {} on every linear layer; request i of a batch uses adapter i mod {}",
            args.loras, args.lora_rank, args.loras
        );
    }
    let guide = match &args.json_schema {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            let schema = serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
            Some(Guide::JsonSchema(schema))
        }
        None => None,
    };
    let client = args.platform.client()?;
    let mut greedy = serde_json::Map::new();
    for &batch in &args.batch {
        let params = upload_parameters(&client, client.device(0)?, &decoder, model.weights.as_ref(), dtype)?;
        let config = EngineConfig {
            max_num_seqs: batch,
            max_model_len,
            dtype,
            max_loras: args.loras,
            max_lora_rank: args.lora_rank,
            ..EngineConfig::default()
        };
        let mut engine = Engine::new(&client, decoder.clone(), params, config)?.with_tokenizer(tokenizer.clone());
        let adapters = (0..args.loras)
            .map(|seed| {
                let (lora, tensors) = random_adapter(&model.config, args.lora_rank, seed as u64)?;
                Ok(Some(engine.load_adapter(&lora, &tensors)?))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let requests = |max_tokens: usize| -> Vec<Request> {
            (0..batch)
                .map(|i| Request {
                    prompt: prompt.clone(),
                    params: SamplingParams {
                        max_tokens,
                        temperature: args.temperature,
                        seed: i as u32,
                        ignore_eos: guide.is_none(),
                        guide: guide.clone(),
                        adapter: adapters.get(i % adapters.len().max(1)).copied().flatten(),
                        ..SamplingParams::default()
                    },
                })
                .collect()
        };
        let (first, full) = (requests(1), requests(1 + args.new_tokens));
        let mut prefill_s = Vec::with_capacity(runs);
        let mut full_s = Vec::with_capacity(runs);
        let mut mask_s = Vec::with_capacity(runs);
        let mut tokens = Vec::new();
        for run in 0..args.timing.warmup + runs {
            let start = Instant::now();
            first_tokens(engine.generate(&first)?, 1)?;
            let middle = Instant::now();
            let masked_before = engine.stats().guide_mask_micros;
            tokens = first_tokens(engine.generate(&full)?, 1 + args.new_tokens)?;
            if run >= args.timing.warmup {
                prefill_s.push((middle - start).as_secs_f64());
                full_s.push(middle.elapsed().as_secs_f64());
                mask_s.push((engine.stats().guide_mask_micros - masked_before) as f64 / 1e6);
            }
        }
        greedy.insert(batch.to_string(), tokens.into());

        let (t1, t) = (median(&mut prefill_s), median(&mut full_s));
        if t <= t1 {
            bail!(
                "batch {batch}: the full run ({t:.3} s) was not slower than the prefill ({t1:.3} s); raise --new-tokens"
            );
        }
        let prefill_rate = (batch * args.prompt_tokens) as f64 / t1;
        let decode_rate = (batch * args.new_tokens) as f64 / (t - t1);
        // The host's mask work per full run, against its decode time.
        let mask_share = median(&mut mask_s) / (t - t1);
        let guided = if guide.is_some() { "json_schema" } else { "none" };
        if args.timing.json {
            let fraction = if batch == 1 {
                format!(", \"bandwidth_fraction\": {:.4}", decode_rate / limit)
            } else {
                String::new()
            };
            println!(
                "{{\"impl\": \"grpo\", \"bench\": \"generate\", \"model\": \"{}\", \"dtype\": \"{}\", \"batch\": {batch}, \
                 \"prompt_tokens\": {}, \"new_tokens\": {}, \"prefill_ms\": {:.3}, \"full_ms\": {:.3}, \
                 \"prefill_tokens_per_s\": {prefill_rate:.3}, \"decode_tokens_per_s\": {decode_rate:.3}, \"runs\": {}, \
                 \"weight_bytes\": {weight_bytes}, \"copy_gbps\": {:.3}, \"bandwidth_tokens_per_s\": {limit:.3}, \
                 \"load_1m\": {}, \"guide\": \"{guided}\", \"mask_share\": {mask_share:.4}, \"loras\": {}, \
                 \"lora_rank\": {}, \"temperature\": {}{fraction}}}",
                model_label(&args.model),
                args.dtype,
                args.prompt_tokens,
                args.new_tokens,
                t1 * 1e3,
                t * 1e3,
                runs,
                bandwidth / 1e9,
                load_average().map_or("null".to_string(), |load| format!("{load:.2}")),
                args.loras,
                args.lora_rank,
                args.temperature,
            );
        } else {
            let fraction = if batch == 1 {
                format!(" = {:.0}% of the bandwidth limit", 100.0 * decode_rate / limit)
            } else {
                String::new()
            };
            let masks = if guide.is_some() {
                format!("; guide masks {:.1}% of the decode time", 100.0 * mask_share)
            } else {
                String::new()
            };
            println!(
                "batch {batch:>3}: prefill {:.1} ms = {prefill_rate:.1} tokens/s; 1 + {} tokens {:.1} ms; \
                 decode {decode_rate:.1} tokens/s{fraction}{masks}",
                t1 * 1e3,
                args.new_tokens,
                t * 1e3
            );
        }
    }
    if let Some(path) = &args.tokens_out {
        let file = serde_json::json!({
            "model": model_label(&args.model),
            "dtype": args.dtype,
            "prompt_ids": prompt,
            "new_tokens": args.new_tokens,
            "temperature": args.temperature,
            "greedy": greedy,
        });
        std::fs::write(path, format!("{file}\n")).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// A temperature ≥ 0 (finite).
fn parse_temperature(text: &str) -> Result<f32, String> {
    match text.parse::<f32>() {
        Ok(t) if t.is_finite() && t >= 0.0 => Ok(t),
        _ => Err(format!(
            "`{text}` is not a temperature: give a number ≥ 0 (0 is greedy)"
        )),
    }
}

/// A LoRA adapter of `rank` on every linear layer of the model of
/// `config`: PEFT's `A` from `seed` and a small non-zero `B`, so it
/// changes what the model draws.
fn random_adapter(
    config: &grpo_model::config::ModelConfig,
    rank: usize,
    seed: u64,
) -> anyhow::Result<(LoraConfig, Vec<(String, grpo_model::weights::HostTensor)>)> {
    let lora = LoraConfig {
        rank,
        alpha: rank as f64,
        targets: Targets::AllLinear,
        use_rslora: false,
    };
    let mut tensors = new_adapters(&lora.layers(config)?, rank, seed)?;
    for (name, tensor) in tensors.iter_mut().filter(|(n, _)| n.ends_with("lora_B.weight")) {
        let mut state = seed.wrapping_add(name.len() as u64) | 1;
        for value in tensor.data.iter_mut() {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            *value = ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.02;
        }
    }
    Ok((lora, tensors.into_iter().collect()))
}

/// Exactly `count` ids of [`PROMPT_TEXT`], repeated as often as needed.
fn prompt_ids(tokenizer: &Tokenizer, count: usize) -> anyhow::Result<Vec<u32>> {
    let mut text = PROMPT_TEXT.to_string();
    loop {
        let ids = tokenizer.encode(&text, true)?;
        if ids.len() >= count {
            return Ok(ids[..count].to_vec());
        }
        text.push(' ');
        text.push_str(PROMPT_TEXT);
    }
}

/// The first request's first completion's tokens, after checking that every
/// completion (per request, its samples) has `expected` tokens.
fn first_tokens(completions: Vec<Vec<Completion>>, expected: usize) -> anyhow::Result<Vec<u32>> {
    if let Some(short) = completions.iter().flatten().find(|c| c.tokens.len() != expected) {
        bail!(
            "a completion has {} tokens, not {expected} (with --json-schema: a schema whose answers are longer)",
            short.tokens.len()
        );
    }
    let first = completions.into_iter().flatten().next().context("no completion")?;
    Ok(first.tokens)
}

/// The median of `values` (the mean of the middle two for an even count).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// Median bytes/s of `copy_from_slice` between two `bytes`-sized buffers,
/// counting the bytes read and written (2 · `bytes` per copy).
fn copy_bandwidth(bytes: usize, runs: usize) -> anyhow::Result<f64> {
    // Both filled, so every page is mapped before the timing.
    let source = vec![0x5au8; bytes];
    let mut target = vec![0xa5u8; bytes];
    let timings = Timings::measure(1, runs, || {
        target.copy_from_slice(&source);
        std::hint::black_box(&mut target);
        Ok(())
    })?;
    Ok(2.0 * bytes as f64 / timings.median().as_secs_f64())
}

/// The 1-minute load average (Linux `/proc/loadavg`), when readable: other
/// work on the machine during a run shows in it.
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The label the report groups by (`smollm2-135m` for the bundled model, as `grpo bench model-step` writes it).
fn model_label(spec: &str) -> &str {
    if spec == grpo_model::bundled::SMOLLM2_NAME {
        "smollm2-135m"
    } else {
        spec
    }
}
