//! `grpo init-model --family llama|mistral|phi3|qwen2|qwen3|qwen3_moe|gemma2|gemma3_text --preset tiny --out DIR`: a
//! random model folder (config, safetensors, the bundled tokenizer or the one
//! `--tokenizer` names) for tests and experiments; transformers loads it too.

use std::path::PathBuf;

use anyhow::Context;
use grpo_model::bundled::SMOLLM2_NAME;
use grpo_model::config::Family;
use grpo_model::init::{Preset, preset_config, random_weights};
use grpo_model::pretrained::{Pretrained, write_model_dir};
use grpo_model::tokenizer::Tokenizer;
use grpo_model::weights::SaveOptions;

/// Arguments of `grpo init-model`.
#[derive(Debug, clap::Args)]
pub struct InitModelArgs {
    /// llama, mistral, phi3, qwen2, qwen3, gemma2 or gemma3_text.
    #[arg(long, value_parser = |s: &str| s.parse::<Family>().map_err(|e| e.to_string()))]
    family: Family,
    /// Model size: tiny, smollm2-135m or llama-1b (those models' shapes).
    #[arg(long, default_value = "tiny", value_parser = |s: &str| s.parse::<Preset>().map_err(|e| e.to_string()))]
    preset: Preset,
    /// A `tokenizer.json` (with its `tokenizer_config.json` beside it) for the
    /// random model; default: the bundled model's tokenizer.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The folder to write.
    #[arg(long)]
    out: PathBuf,
}

/// Writes the random model.
pub fn run(args: &InitModelArgs) -> anyhow::Result<()> {
    let tokenizer = match &args.tokenizer {
        Some(file) => Tokenizer::from_file(file)?,
        None => Pretrained::open(SMOLLM2_NAME)
            .context("the random model borrows the bundled tokenizer (or pass --tokenizer)")?
            .tokenizer
            .context("the bundled model has no tokenizer")?,
    };
    let eos = tokenizer
        .eos_id()
        .context("the tokenizer has no end-of-sequence token")?;
    let config = preset_config(
        args.family,
        args.preset,
        tokenizer.vocab_size(),
        tokenizer.bos_id(),
        eos,
    );
    let weights = random_weights(&config, args.seed)?;
    write_model_dir(
        &args.out,
        &config.to_hf_json(),
        &config,
        &weights,
        &tokenizer,
        SaveOptions::default(),
    )?;
    println!(
        "wrote a random {} model ({} tensors) to {}",
        args.family.model_type(),
        weights.len(),
        args.out.display()
    );
    Ok(())
}
