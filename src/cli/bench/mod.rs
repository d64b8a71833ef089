//! `grpo bench …`: measurements of the device that later figures (MFU,
//! bandwidth use) are reported against.

mod generate;
mod matmul;
mod model_step;
mod moe;
mod timing;
mod train_step;

/// The benchmarks.
#[derive(Debug, clap::Subcommand)]
pub enum BenchCommand {
    /// GFLOP/s of a square matrix product per dtype and size (median of several runs).
    Matmul(matmul::MatmulArgs),
    /// Time of one compiled training step (forward, backward, clipping, AdamW)
    /// of a benchmark model, to compare with `bench/train_step_torch.py`.
    TrainStep(train_step::TrainStepArgs),
    /// Time of a pretrained model's training forward + backward (one
    /// compiled program), to compare with `bench/model_step_torch.py`.
    ModelStep(model_step::ModelStepArgs),
    /// Prefill and decode tokens/s of the rollout engine per batch size, to
    /// compare with `bench/generate_torch.py`.
    Generate(generate::GenerateArgs),
    /// Forward + backward of one sparse (mixture-of-experts) MLP layer: the
    /// grouped expert product against every expert computed for every token.
    Moe(moe::MoeArgs),
}

impl BenchCommand {
    /// Runs the chosen benchmark.
    pub fn run(self) -> anyhow::Result<()> {
        match self {
            BenchCommand::Matmul(args) => matmul::run(&args),
            BenchCommand::TrainStep(args) => train_step::run(&args),
            BenchCommand::ModelStep(args) => model_step::run(&args),
            BenchCommand::Generate(args) => generate::run(&args),
            BenchCommand::Moe(args) => moe::run(&args),
        }
    }
}
