//! Repeated timing of one operation: warm-up runs, then the median and best
//! of the measured runs (these machines are noisy; the median is the figure).

use std::time::{Duration, Instant};

/// How many runs to time, and how to print them; shared by every benchmark.
#[derive(Debug, Clone, clap::Args)]
pub struct TimingArgs {
    /// Timed runs per case; the median is reported.
    #[arg(long, default_value_t = 7)]
    pub runs: usize,
    /// Untimed runs before timing.
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Print JSON lines (one per case) instead of text.
    #[arg(long)]
    pub json: bool,
}

impl TimingArgs {
    /// Times `op` with these counts.
    pub fn measure(&self, op: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<Timings> {
        Timings::measure(self.warmup, self.runs, op)
    }
}

/// Durations of the measured runs.
#[derive(Debug, Clone)]
pub struct Timings {
    runs: Vec<Duration>,
}

impl Timings {
    /// Runs `op` `warmup` times untimed, then `runs` times timed.
    pub fn measure(warmup: usize, runs: usize, mut op: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<Timings> {
        for _ in 0..warmup {
            op()?;
        }
        let mut measured = Vec::with_capacity(runs);
        for _ in 0..runs.max(1) {
            let start = Instant::now();
            op()?;
            measured.push(start.elapsed());
        }
        measured.sort();
        Ok(Timings { runs: measured })
    }

    /// The median run (the mean of the middle two for an even count).
    pub fn median(&self) -> Duration {
        let n = self.runs.len();
        if n % 2 == 1 {
            self.runs[n / 2]
        } else {
            (self.runs[n / 2 - 1] + self.runs[n / 2]) / 2
        }
    }

    /// The fastest run.
    pub fn best(&self) -> Duration {
        self.runs[0]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_best_of_sorted_runs() {
        let odd = Timings {
            runs: [1, 2, 3].map(Duration::from_millis).into_iter().collect(),
        };
        assert_eq!(odd.median(), Duration::from_millis(2));
        assert_eq!(odd.best(), Duration::from_millis(1));
        let even = Timings {
            runs: [1, 2, 4, 9].map(Duration::from_millis).into_iter().collect(),
        };
        assert_eq!(even.median(), Duration::from_millis(3));
    }
}
