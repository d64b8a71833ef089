//! `grpo bench …`: measurements of the device that later figures (MFU,
//! bandwidth use) are reported against.

mod matmul;
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
}

impl BenchCommand {
    /// Runs the chosen benchmark.
    pub fn run(self) -> anyhow::Result<()> {
        match self {
            BenchCommand::Matmul(args) => matmul::run(&args),
            BenchCommand::TrainStep(args) => train_step::run(&args),
        }
    }
}
