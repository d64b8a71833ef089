//! What `grpo run` shows while it works: a progress bar on a terminal
//! (step, reward, eval accuracy, step time, tokens/s), one line per step
//! otherwise (logs, CI).

use std::io::IsTerminal;

use grpo_learner::grpo::{EvalReport, StepReport};
use indicatif::{ProgressBar, ProgressStyle};

/// The run's progress display.
pub struct Progress {
    bar: Option<ProgressBar>,
    steps: usize,
    accuracy: Option<f64>,
}

impl Progress {
    /// A display for a run of `steps` steps, `done` of them already done.
    pub fn new(steps: usize, done: usize) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(steps as u64).with_position(done as u64);
            bar.set_style(
                ProgressStyle::with_template("{bar:30} {pos}/{len} steps  {msg}  [{elapsed} < {eta}]")
                    .expect("a valid template"),
            );
            bar
        });
        Progress {
            bar,
            steps,
            accuracy: None,
        }
    }

    /// Shows a finished step that took `seconds`.
    pub fn step(&mut self, report: &StepReport, seconds: f64, tokens: usize) {
        let accuracy = self
            .accuracy
            .map(|a| format!("{:.1}%", a * 100.0))
            .unwrap_or("–".to_string());
        let message = format!(
            "reward {:.3} ± {:.3}  eval {accuracy}  loss {:.4}  len {:.1}  {seconds:.1} s/step  {:.0} tok/s",
            report.reward,
            report.reward_std,
            report.loss,
            report.mean_length,
            tokens as f64 / seconds.max(1e-9),
        );
        match &self.bar {
            Some(bar) => {
                bar.set_message(message);
                bar.inc(1);
            }
            None => eprintln!("step {}/{}  {message}", report.step, self.steps),
        }
    }

    /// Shows an evaluation after `step` steps.
    pub fn eval(&mut self, step: usize, eval: &EvalReport) {
        self.accuracy = Some(eval.accuracy);
        self.line(&format!(
            "eval after {step} steps: accuracy {:.1}%  reward {:.3}  len {:.1}  ({} prompts, {:.1} s)",
            eval.accuracy * 100.0,
            eval.reward,
            eval.mean_length,
            eval.prompts,
            eval.seconds
        ));
    }

    /// Prints a line above the bar (or plainly).
    pub fn line(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => eprintln!("{text}"),
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish();
        }
    }
}
