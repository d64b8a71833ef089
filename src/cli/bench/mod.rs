//! `grpo bench …`: measurements of the device that later figures (MFU,
//! bandwidth use) are reported against.

mod matmul;
mod timing;

/// The benchmarks.
#[derive(Debug, clap::Subcommand)]
pub enum BenchCommand {
    /// GFLOP/s of a square matrix product per dtype and size (median of several runs).
    Matmul(matmul::MatmulArgs),
}

impl BenchCommand {
    /// Runs the chosen benchmark.
    pub fn run(self) -> anyhow::Result<()> {
        match self {
            BenchCommand::Matmul(args) => matmul::run(&args),
        }
    }
}
