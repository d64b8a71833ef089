//! Reports beyond `metrics.jsonl`, at TRL's cadence (`[logging]`
//! `report_to`, `logging_steps`, `log_completions`): every `logging_steps`
//! steps (and at the last) each numeric training metric's mean over the
//! steps since the last report goes to TensorBoard under the Hugging Face
//! trainer's tags (`train/<name>`; evaluations as `eval/<name>` at their
//! own step), and with `log_completions` a table of the step's sampled
//! completions goes to TensorBoard's text tab and to
//! `OUT/completions.jsonl`. With `prometheus_listen`, a Prometheus page
//! follows each step ([`crate::prometheus`]). A resumed run takes the steps since the last
//! report back from `metrics.jsonl`, so its reports are the ones an
//! uninterrupted run makes.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use crate::config::{LoggingSection, Tracker};
use crate::error::Result;
use crate::hooks::{Hook, MetricsLog, RunContext, io, open_step_lines};
use crate::prometheus::Exporter;
use crate::record::RolloutRow;
use crate::tensorboard::EventFile;
use crate::trainer::StepRecord;

/// The TensorBoard folder of the run in `out`.
pub fn tensorboard_dir(out: &Path) -> PathBuf {
    out.join("tensorboard")
}

/// The completions table of the run in `out`.
pub fn completions_path(out: &Path) -> PathBuf {
    out.join("completions.jsonl")
}

/// What a run reports besides `metrics.jsonl`.
#[derive(Debug, Clone)]
pub struct Reporting {
    every: usize,
    tensorboard: bool,
    /// With `log_completions`: the most rows a table holds (`None`: all).
    completions: Option<Option<usize>>,
    /// Where the Prometheus page is served.
    prometheus: Option<SocketAddr>,
}

impl Reporting {
    /// What `logging` asks for, `None` when it asks for nothing.
    pub fn of<D>(logging: &LoggingSection<D>) -> Result<Option<Reporting>> {
        let tensorboard = logging.trackers()?.contains(&Tracker::TensorBoard);
        let prometheus = logging.prometheus_listen;
        Ok(
            (tensorboard || logging.log_completions || prometheus.is_some()).then(|| Reporting {
                every: logging.logging_steps.max(1),
                tensorboard,
                completions: logging.log_completions.then_some(logging.num_completions_to_print),
                prometheus,
            }),
        )
    }

    /// The hooks that report it: the trackers' and tables' [`Reports`], and
    /// the Prometheus [`Exporter`].
    pub fn hooks(&self) -> Vec<Box<dyn Hook>> {
        let mut hooks: Vec<Box<dyn Hook>> = Vec::new();
        if self.tensorboard || self.completions.is_some() {
            hooks.push(Box::new(Reports {
                settings: self.clone(),
                window: BTreeMap::new(),
                events: None,
                table: None,
            }));
        }
        if let Some(addr) = self.prometheus {
            hooks.push(Box::new(Exporter::new(addr)));
        }
        hooks
    }
}

/// The reporting hook.
pub struct Reports {
    settings: Reporting,
    /// Each metric's sum and count since the last report.
    window: BTreeMap<String, (f64, usize)>,
    events: Option<EventFile>,
    table: Option<(PathBuf, File)>,
}

impl Reports {
    /// Adds a step's training metrics to the window; returns its
    /// evaluation's, under TensorBoard tags.
    fn add(&mut self, metrics: &Map<String, Value>) -> Vec<(String, f32)> {
        let mut evaluation = Vec::new();
        for (name, value) in metrics {
            let Some(value) = value.as_f64().filter(|v| v.is_finite()) else {
                continue;
            };
            match name.strip_prefix("eval_") {
                Some(rest) => evaluation.push((format!("eval/{rest}"), value as f32)),
                None => {
                    let (sum, count) = self.window.entry(name.clone()).or_default();
                    *sum += value;
                    *count += 1;
                }
            }
        }
        evaluation
    }

    /// The window's means under TensorBoard tags, emptying it.
    fn means(&mut self) -> Vec<(String, f32)> {
        std::mem::take(&mut self.window)
            .into_iter()
            .map(|(name, (sum, count))| (format!("train/{name}"), (sum / count as f64) as f32))
            .collect()
    }

    /// Refills the window with the steps of `metrics` after the last
    /// report at or before step `done` (a resumed run's).
    fn refill(&mut self, metrics: &Path, done: usize) -> Result<()> {
        let since = done - done % self.settings.every;
        let text = std::fs::read_to_string(metrics).map_err(|e| io(metrics, "read", e))?;
        for line in text.lines() {
            if let Ok(Value::Object(line)) = serde_json::from_str::<Value>(line)
                && let Some(step) = line.get("step").and_then(Value::as_u64)
                && (since as u64 + 1..=done as u64).contains(&step)
            {
                self.add(&line);
            }
        }
        Ok(())
    }
}

impl Hook for Reports {
    fn on_start(&mut self, run: &mut dyn RunContext) -> Result<()> {
        let resumed = run.resumed_from().is_some();
        let done = run.steps_done();
        if self.settings.tensorboard {
            let mut events = EventFile::create(&tensorboard_dir(run.out()))?;
            if resumed {
                events.restart_at(done + 1)?;
            }
            self.events = Some(events);
        }
        if resumed {
            self.refill(&MetricsLog::path(run.out()), done)?;
        }
        if self.settings.completions.is_some() {
            let path = completions_path(run.out());
            let file = open_step_lines(&path, run)?;
            self.table = Some((path, file));
        }
        Ok(())
    }

    fn on_step(&mut self, run: &mut dyn RunContext, record: &mut StepRecord) -> Result<()> {
        let step = record.step;
        let evaluation = self.add(&record.metrics);
        if let Some(events) = &mut self.events
            && !evaluation.is_empty()
        {
            events.scalars(step, &evaluation)?;
        }
        if !(step.is_multiple_of(self.settings.every) || step == run.max_steps()) {
            return Ok(());
        }
        let means = self.means();
        if let Some(events) = &mut self.events
            && !means.is_empty()
        {
            events.scalars(step, &means)?;
        }
        if let Some(most) = self.settings.completions
            && !record.rollouts.is_empty()
        {
            let rows = &record.rollouts[..most.unwrap_or(usize::MAX).min(record.rollouts.len())];
            if let Some(events) = &mut self.events {
                events.text(step, "completions", &markdown(rows))?;
            }
            if let Some((path, file)) = &mut self.table {
                file.write_all(lines(step, rows).as_bytes())
                    .map_err(|e| io(path, "write", e))?;
            }
        }
        Ok(())
    }
}

/// `rows` as a Markdown table (prompt, completion, reward, advantage).
fn markdown(rows: &[RolloutRow]) -> String {
    let cell = |text: &str| text.replace('|', "\\|").replace('\n', " ⏎ ");
    let mut table = String::from("| prompt | completion | reward | advantage |\n|---|---|---:|---:|\n");
    for row in rows {
        let reward = row.reward.map_or("—".to_string(), |r| format!("{r:.4}"));
        table.push_str(&format!(
            "| {} | {} | {reward} | {:.4} |\n",
            cell(&row.prompt),
            cell(&row.completion),
            row.advantage
        ));
    }
    table
}

/// `rows` as `completions.jsonl` lines, written in one piece.
fn lines(step: usize, rows: &[RolloutRow]) -> String {
    rows.iter()
        .map(|row| {
            let line = json!({
                "step": step,
                "prompt": row.prompt,
                "completion": row.completion,
                "reward": row.reward,
                "advantage": row.advantage,
            });
            format!("{}\n", Value::to_string(&line))
        })
        .collect()
}
