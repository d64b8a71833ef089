//! Subcommands of the `grpo` binary, one module each.

mod adapter;
mod bench;
mod convert;
mod devices;
mod generate;
mod init_model;
mod logprobs;
mod merge;
mod platform;
mod progress;
mod reward;
mod run;
mod serve;
mod serve_lora;
mod setup;
mod sft;
mod train;
mod worker;

use clap::{Parser, Subcommand};

/// GRPO post-training for language models, on XLA through PJRT plugins.
#[derive(Debug, Parser)]
#[command(name = "grpo", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Fine-tune a policy with GRPO as a run config says.
    Run(train::TrainArgs),
    /// Supervised fine-tuning on prompt/completion pairs (a warm start for `run`).
    Sft(train::TrainArgs),
    /// Install a PJRT plugin (the CPU one by default) into grpo's cache folder.
    Setup(setup::SetupArgs),
    /// Show the plugin, its versions and its devices.
    Devices(platform::PlatformArgs),
    /// Convert a GGUF model into a Hugging Face folder.
    Convert(convert::ConvertArgs),
    /// Merge a LoRA adapter folder into its base model, as a Hugging Face folder.
    Merge(merge::MergeArgs),
    /// Generate completions of a prompt.
    Generate(generate::GenerateArgs),
    /// Serve the model over an OpenAI / vLLM-compatible HTTP API.
    Serve(serve::ServeArgs),
    /// Serve the rollout engine over gRPC to a learner (loopback unless --host says otherwise).
    Worker(worker::WorkerArgs),
    /// Write a random model (config, weights, tokenizer) for tests and experiments.
    InitModel(init_model::InitModelArgs),
    /// Log-probabilities of completion tokens under a model (JSONL in, JSONL out).
    Logprobs(logprobs::LogprobsArgs),
    /// Score completions with the config's `[[reward]]` tables (JSONL in, JSONL out).
    Reward(reward::RewardArgs),
    /// Measure the device: `grpo bench matmul`.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

impl Cli {
    /// Runs the chosen subcommand.
    pub fn run(self) -> anyhow::Result<()> {
        match self.command {
            Command::Setup(args) => setup::run(&args),
            Command::Devices(args) => devices::run(&args),
            Command::Convert(args) => convert::run(&args),
            Command::Merge(args) => merge::run(&args),
            Command::Generate(args) => generate::run(&args),
            Command::Serve(args) => serve::run(&args),
            Command::Worker(args) => worker::run(&args),
            Command::InitModel(args) => init_model::run(&args),
            Command::Logprobs(args) => logprobs::run(&args),
            Command::Reward(args) => reward::run(&args),
            Command::Run(args) => run::run(&args),
            Command::Sft(args) => sft::run(&args),
            Command::Bench(command) => command.run(),
        }
    }
}
