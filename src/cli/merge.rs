//! `grpo merge --base M --adapter A --out DIR`: a model with a PEFT LoRA
//! adapter folder merged into its weights, written as a plain Hugging Face
//! folder (config.json, model.safetensors in f32, tokenizer files) that
//! transformers, vLLM and grpo load without PEFT.

use std::path::PathBuf;

use anyhow::{Context, bail};
use grpo_learner::checkpoint::{SavedModel, SavedPolicy, save_model};
use grpo_model::decoder::Decoder;
use grpo_model::pretrained::Pretrained;
use grpo_model::weights::SaveOptions;

use crate::cli::adapter::{merged, read};

/// Arguments of `grpo merge`.
#[derive(Debug, clap::Args)]
pub struct MergeArgs {
    /// The base model: a folder, a .gguf file, or `smollm2-135m-instruct`.
    #[arg(long)]
    base: String,
    /// The PEFT LoRA adapter folder trained on it.
    #[arg(long)]
    adapter: PathBuf,
    /// The folder to write (must not exist yet).
    #[arg(long)]
    out: PathBuf,
}

/// Merges and reports what was written.
pub fn run(args: &MergeArgs) -> anyhow::Result<()> {
    if args.out.exists() {
        bail!("--out {} already exists: choose a new folder", args.out.display());
    }
    let model = Pretrained::open(&args.base)?;
    let folder = read(&args.adapter, &model.config)?;
    let tokenizer = model
        .tokenizer
        .as_ref()
        .context("the base model has no tokenizer: use a folder with tokenizer.json, or a GGUF file")?;
    let weights = merged(model.weights.as_ref(), Some(&folder));
    let decoder = Decoder::new(model.config.clone());
    let tensors = decoder
        .parameters()
        .iter()
        .map(|spec| Ok((spec.name.clone(), weights.tensor(&spec.name)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let count = tensors.len();
    let model_files = SavedModel {
        config: &model.config,
        tokenizer,
        name: &args.base,
        options: SaveOptions::default(),
    };
    save_model(&args.out, model_files, &SavedPolicy::Model(tensors))?;
    println!(
        "merged {} ({}) into {count} tensors of {}: wrote {}",
        args.adapter.display(),
        folder.lora.describe(&model.config),
        args.base,
        args.out.display()
    );
    Ok(())
}
