//! What `grpo run` and `grpo sft` show while they work, as a hook of the
//! run: a progress bar on a terminal (step, reward or loss, eval result,
//! step time, tokens/s), one line per step otherwise (logs, CI); notes of
//! other hooks (checkpoints written) above it.

use std::io::IsTerminal;

use grpo_learner::Result;
use grpo_learner::hooks::{Hook, RunContext};
use grpo_learner::trainer::StepRecord;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Map, Value};

/// The run's progress display.
pub struct Progress {
    bar: Option<ProgressBar>,
    steps: usize,
    /// The latest evaluation, as shown.
    eval: String,
}

impl Progress {
    /// A display for a run of `steps` steps.
    pub fn new(steps: usize) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(steps as u64);
            bar.set_style(
                ProgressStyle::with_template("{bar:30} {pos}/{len} steps  {msg}  [{elapsed} < {eta}]")
                    .expect("a valid template"),
            );
            bar
        });
        Progress {
            bar,
            steps,
            eval: "–".to_string(),
        }
    }

    /// Prints a line above the bar (or plainly).
    fn line(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => eprintln!("{text}"),
        }
    }

    /// Shows the evaluation in `metrics`, if it holds one, after `step` steps.
    fn eval(&mut self, step: usize, metrics: &Map<String, Value>) {
        let number = |key: &str| metrics.get(key).and_then(Value::as_f64);
        let (shown, short) = match (number("eval_accuracy"), number("eval_loss")) {
            (Some(accuracy), _) => (
                format!(
                    "accuracy {:.1}%  reward {:.3}  len {:.1}  ({} prompts, {:.1} s)",
                    accuracy * 100.0,
                    number("eval_reward").unwrap_or(0.0),
                    number("eval_completions/mean_length").unwrap_or(0.0),
                    number("eval_prompts").unwrap_or(0.0),
                    number("eval_runtime").unwrap_or(0.0)
                ),
                format!("{:.1}%", accuracy * 100.0),
            ),
            (None, Some(loss)) => (format!("loss {loss:.4}"), format!("{loss:.4}")),
            (None, None) => return,
        };
        self.line(&format!("eval after {step} steps: {shown}"));
        self.eval = short;
    }
}

impl Hook for Progress {
    fn on_start(&mut self, run: &mut dyn RunContext) -> Result<()> {
        if let Some(bar) = &self.bar {
            bar.set_position(run.steps_done() as u64);
        }
        if let Some(dir) = run.resumed_from() {
            self.line(&format!(
                "resuming after step {} from {}",
                run.steps_done(),
                dir.display()
            ));
        }
        Ok(())
    }

    fn on_step(&mut self, _: &mut dyn RunContext, record: &mut StepRecord) -> Result<()> {
        let m = &record.metrics;
        if record.step > 0 {
            let number = |key: &str| m.get(key).and_then(Value::as_f64).unwrap_or(0.0);
            let seconds = number("step_time");
            let reward = match m.get("reward") {
                Some(_) => format!("reward {:.3} ± {:.3}  ", number("reward"), number("reward_std")),
                None => String::new(),
            };
            let message = format!(
                "{reward}eval {}  loss {:.4}  grad norm {:.3}  {seconds:.1} s/step  {:.0} tok/s",
                self.eval,
                number("loss"),
                number("grad_norm"),
                record.tokens as f64 / seconds.max(1e-9),
            );
            match &self.bar {
                Some(bar) => {
                    bar.set_message(message);
                    bar.inc(1);
                }
                None => eprintln!("step {}/{}  {message}", record.step, self.steps),
            }
        }
        self.eval(record.step, &record.metrics);
        for note in &record.notes {
            self.line(note);
        }
        Ok(())
    }

    fn on_end(&mut self, _: &mut dyn RunContext) -> Result<()> {
        if let Some(bar) = &self.bar {
            bar.finish();
        }
        Ok(())
    }
}
