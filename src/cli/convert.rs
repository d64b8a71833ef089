//! `grpo convert --gguf FILE --out DIR`: a GGUF model as a Hugging Face
//! folder (config.json, model.safetensors, tokenizer files,
//! generation_config.json) that transformers and grpo load.

use std::path::PathBuf;

use grpo_model::pretrained::convert_gguf;

/// Arguments of `grpo convert`.
#[derive(Debug, clap::Args)]
pub struct ConvertArgs {
    /// The GGUF file to convert.
    #[arg(long)]
    gguf: PathBuf,
    /// The folder to write.
    #[arg(long)]
    out: PathBuf,
}

/// Converts and reports what was written.
pub fn run(args: &ConvertArgs) -> anyhow::Result<()> {
    let count = convert_gguf(&args.gguf, &args.out)?;
    println!("wrote {count} tensors and the tokenizer to {}", args.out.display());
    Ok(())
}
