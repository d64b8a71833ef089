//! `grpo reward --config FILE --input samples.jsonl`: scores each input
//! line with the config's `[[reward]]` tables and prints, in order, one
//! line `{"reward": float | null, "components": {name: float}}`.
//!
//! Input lines are `{"prompt": text | messages, "completion": text, <columns>}`
//! (optionally `completion_ids` and `group_id`). Lines are scored in batches
//! through the reward pool, several at once; fault counts go to the log.

use std::io::{BufRead, Write};
use std::path::PathBuf;

use anyhow::Context;
use grpo_reward::{Registry, RewardsConfig, Sample};

/// Arguments of `grpo reward`.
#[derive(Debug, clap::Args)]
pub struct RewardArgs {
    /// A TOML file with `[[reward]]` tables (a full run config works too).
    #[arg(long)]
    config: PathBuf,
    /// JSONL input, one sample per line.
    #[arg(long)]
    input: PathBuf,
    /// Samples per reward call.
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
}

/// Runs `grpo reward`.
pub fn run(args: &RewardArgs) -> anyhow::Result<()> {
    let config = RewardsConfig::from_file(&args.config)?;
    let file = std::fs::File::open(&args.input).with_context(|| format!("opening {}", args.input.display()))?;
    let mut samples = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("reading {}", args.input.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let row = serde_json::from_str(&line).with_context(|| format!("{} line {}", args.input.display(), i + 1))?;
        samples.push(Sample::from_row(samples.len() as u64, row)?);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let pool = config.build(&Registry::default())?;
        let batches: Vec<_> = samples
            .chunks(args.batch_size.max(1))
            .map(|b| pool.spawn(b.to_vec()))
            .collect();
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        for batch in batches {
            for total in batch.await?? {
                serde_json::to_writer(&mut out, &total)?;
                out.write_all(b"\n")?;
            }
        }
        out.flush()?;
        for (name, metrics) in pool.metrics() {
            tracing::info!(reward = %name, "{}", serde_json::to_string(&metrics)?);
        }
        Ok(())
    })
}
