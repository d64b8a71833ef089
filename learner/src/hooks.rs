//! What happens around a run's steps, as hooks (callbacks) of its loop, in
//! the order they are given: each sees a step's [`StepRecord`] after the
//! ones before it, and may add to it (an evaluation's metrics, a note).
//! [`crate::run::Run::standard_hooks`] gives the ones a config asks for:
//!
//! - [`Evaluation`]: the task's evaluation before the first step, every
//!   `eval_every` steps and after the last, merged into the step's metrics.
//! - [`MetricsLog`]: `OUT/metrics.jsonl`, one JSON line per step.
//! - [`RolloutFile`]: `OUT/rollouts.parquet/`, every sampled completion.
//! - [`Checkpoints`]: `OUT/checkpoint-<step>/` every `every` steps and after
//!   the last, the oldest pruned beyond `keep_last`.
//! - [`FinalModel`]: `OUT/final/`, the policy as a Hugging Face folder.
//! - [`Plot`]: `OUT/progress.png`, reward and eval accuracy by step.
//!
//! A front end adds its own (the CLI's progress bar is one).

use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::checkpoint;
use crate::error::{Error, Result};
use crate::metrics::renamed;
use crate::plot::plot_metrics;
use crate::record::RolloutLog;
use crate::trainer::StepRecord;

/// What a hook sees of the run and may ask of it.
pub trait RunContext {
    /// The output folder.
    fn out(&self) -> &Path;
    /// The run's last step.
    fn max_steps(&self) -> usize;
    /// Steps completed.
    fn steps_done(&self) -> usize;
    /// The checkpoint the run continues from, if it was resumed.
    fn resumed_from(&self) -> Option<&Path>;
    /// Evaluates the current weights (`None` without held-out data).
    fn evaluate(&mut self) -> Result<Option<Map<String, Value>>>;
    /// Writes the checkpoint of the steps done; returns its folder.
    fn checkpoint(&self) -> Result<PathBuf>;
    /// Writes the current policy as a Hugging Face folder at `dir`.
    fn save_model(&self, dir: &Path) -> Result<()>;
}

/// A callback of the run's loop.
pub trait Hook {
    /// Before the first step.
    fn on_start(&mut self, _run: &mut dyn RunContext) -> Result<()> {
        Ok(())
    }

    /// After each step (and once with step 0 before a new run's first,
    /// holding only what hooks add, such as the evaluation at the start).
    fn on_step(&mut self, _run: &mut dyn RunContext, _record: &mut StepRecord) -> Result<()> {
        Ok(())
    }

    /// After the last step.
    fn on_end(&mut self, _run: &mut dyn RunContext) -> Result<()> {
        Ok(())
    }
}

/// Whether a cadence of `every` steps falls on `step` of a run of `max_steps`
/// (its multiples and the last step; never for 0).
fn due(every: usize, step: usize, max_steps: usize) -> bool {
    every > 0 && (step.is_multiple_of(every) || step == max_steps)
}

/// The task's evaluation before the first step, every `every` steps and
/// after the last (0: never), its `eval_…` metrics added to the step's.
pub struct Evaluation {
    /// Steps between evaluations.
    pub every: usize,
}

impl Hook for Evaluation {
    fn on_step(&mut self, run: &mut dyn RunContext, record: &mut StepRecord) -> Result<()> {
        if due(self.every, record.step, run.max_steps())
            && let Some(metrics) = run.evaluate()?
        {
            record.metrics.extend(metrics);
        }
        Ok(())
    }
}

/// `OUT/metrics.jsonl`: one JSON object per step, each line appended with
/// one write. A new run starts the file afresh. A resumed run first drops
/// the lines of steps after its checkpoint (it runs them again) and a last
/// line torn by a crash mid-write (saying so), and renames the metrics of
/// the lines it keeps that were written under grpo's old names
/// ([`crate::metrics::RENAMED`]), rewriting the file atomically, so every
/// step appears once and under one name.
#[derive(Default)]
pub struct MetricsLog {
    file: Option<(PathBuf, std::fs::File)>,
}

impl MetricsLog {
    /// The metrics file of the run in `out`.
    pub fn path(out: &Path) -> PathBuf {
        out.join("metrics.jsonl")
    }
}

impl Hook for MetricsLog {
    fn on_start(&mut self, run: &mut dyn RunContext) -> Result<()> {
        let path = MetricsLog::path(run.out());
        let file = open_step_lines(&path, run)?;
        self.file = Some((path, file));
        Ok(())
    }

    fn on_step(&mut self, _: &mut dyn RunContext, record: &mut StepRecord) -> Result<()> {
        if record.step == 0 && record.metrics.is_empty() {
            return Ok(());
        }
        let Some((path, file)) = &mut self.file else {
            return Ok(());
        };
        let mut line = record.metrics.clone();
        line.insert("step".to_string(), record.step.into());
        let mut text = Value::Object(line).to_string();
        text.push('\n');
        file.write_all(text.as_bytes()).map_err(|e| io(path, "write", e))
    }
}

/// Opens the JSON lines file `path` to append a run's steps: started
/// afresh for a new run, kept up to its checkpoint's step for a resumed
/// one (see [`keep_steps_up_to`]).
pub(crate) fn open_step_lines(path: &Path, run: &dyn RunContext) -> Result<std::fs::File> {
    if run.resumed_from().is_some() {
        keep_steps_up_to(path, run.steps_done() as u64)?;
    } else {
        std::fs::File::create(path).map_err(|e| io(path, "start", e))?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| io(path, "open", e))
}

/// Rewrites `path` keeping the lines whose `step` is at most `step`, under
/// the current metric names; a last line without its newline that is not
/// JSON (a write a crash cut short) is dropped with a warning.
fn keep_steps_up_to(path: &Path, step: u64) -> Result<()> {
    let Ok(text) = std::fs::read(path) else {
        return Ok(());
    };
    let text = String::from_utf8_lossy(&text);
    let torn = !text.is_empty() && !text.ends_with('\n');
    let count = text.lines().count();
    let mut kept = String::new();
    for (number, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let value: Value = match serde_json::from_str(line) {
            Ok(value) => value,
            Err(_) if torn && number + 1 == count => {
                tracing::warn!("{}: dropped a last line torn by a crash mid-write", path.display());
                continue;
            }
            Err(e) => {
                return Err(Error::Data {
                    path: path.to_path_buf(),
                    line: number + 1,
                    message: format!("not JSON: {e}"),
                });
            }
        };
        if let Value::Object(line) = value
            && line.get("step").and_then(Value::as_u64).is_some_and(|s| s <= step)
        {
            kept.push_str(&Value::Object(renamed(line)).to_string());
            kept.push('\n');
        }
    }
    crate::files::replace(path, kept.as_bytes()).map_err(|e| io(path, "replace", e))
}

/// `OUT/rollouts.parquet/`: every sampled completion, one part per step; a
/// run first drops the parts of steps after its start (a resumed run's
/// checkpoint; all of them for a new run).
#[derive(Default)]
pub struct RolloutFile {
    log: Option<RolloutLog>,
}

impl Hook for RolloutFile {
    fn on_start(&mut self, run: &mut dyn RunContext) -> Result<()> {
        let log = RolloutLog::open(run.out())?;
        log.truncate_after(run.steps_done() as u64)?;
        self.log = Some(log);
        Ok(())
    }

    fn on_step(&mut self, _: &mut dyn RunContext, record: &mut StepRecord) -> Result<()> {
        if let Some(log) = &self.log
            && record.step > 0
        {
            log.append(record.step as u64, &record.rollouts)?;
        }
        Ok(())
    }
}

/// `OUT/checkpoint-<step>/` every `every` steps and after the last (0:
/// never), keeping the newest `keep_last` (0: all).
pub struct Checkpoints {
    /// Steps between checkpoints.
    pub every: usize,
    /// Checkpoints kept.
    pub keep_last: usize,
}

impl Hook for Checkpoints {
    fn on_step(&mut self, run: &mut dyn RunContext, record: &mut StepRecord) -> Result<()> {
        if record.step > 0 && due(self.every, record.step, run.max_steps()) {
            let dir = run.checkpoint()?;
            checkpoint::prune(run.out(), self.keep_last)?;
            record.notes.push(format!("checkpoint {}", dir.display()));
        }
        Ok(())
    }
}

/// `OUT/final/`: the policy after the last step as a Hugging Face folder.
pub struct FinalModel;

impl FinalModel {
    /// The final folder of the run in `out`.
    pub fn dir(out: &Path) -> PathBuf {
        out.join("final")
    }
}

impl Hook for FinalModel {
    fn on_end(&mut self, run: &mut dyn RunContext) -> Result<()> {
        run.save_model(&FinalModel::dir(run.out()))
    }
}

/// `OUT/progress.png`: training reward and eval accuracy by step, drawn
/// from `OUT/metrics.jsonl` after the last step.
pub struct Plot;

impl Plot {
    /// The plot of the run in `out`.
    pub fn path(out: &Path) -> PathBuf {
        out.join("progress.png")
    }
}

impl Hook for Plot {
    fn on_end(&mut self, run: &mut dyn RunContext) -> Result<()> {
        plot_metrics(&MetricsLog::path(run.out()), &Plot::path(run.out()))
    }
}

/// An I/O failure on `path` while trying to `what`, as a data error.
pub(crate) fn io(path: &Path, what: &str, e: std::io::Error) -> Error {
    Error::Data {
        path: path.to_path_buf(),
        line: 0,
        message: format!("cannot {what}: {e}"),
    }
}
