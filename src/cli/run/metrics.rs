//! `OUT/metrics.jsonl`: one JSON object per step, appended. A resumed run
//! first drops the lines of steps after its checkpoint (it runs them
//! again), rewriting the file atomically, so every step appears once.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;

/// The metrics file of a run, open for appending.
pub struct MetricsLog {
    path: PathBuf,
    file: std::fs::File,
}

impl MetricsLog {
    /// Opens `out/metrics.jsonl`; with `resume_after` (the steps a resumed
    /// run's checkpoint holds), lines of later steps are dropped first.
    pub fn open(out: &Path, resume_after: Option<u64>) -> anyhow::Result<MetricsLog> {
        let path = out.join("metrics.jsonl");
        if let Some(step) = resume_after {
            keep_steps_up_to(&path, step)?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        Ok(MetricsLog { path, file })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one line.
    pub fn append(&mut self, line: &serde_json::Value) -> anyhow::Result<()> {
        writeln!(self.file, "{line}").with_context(|| format!("writing {}", self.path.display()))
    }
}

/// Rewrites `path` keeping the lines whose `step` is at most `step`.
fn keep_steps_up_to(path: &Path, step: u64) -> anyhow::Result<()> {
    let Ok(file) = std::fs::File::open(path) else {
        return Ok(());
    };
    let mut kept = String::new();
    for (number, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("reading {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let value: serde_json::Value =
            serde_json::from_str(&line).with_context(|| format!("{}:{}: not JSON", path.display(), number + 1))?;
        if value["step"].as_u64().is_some_and(|s| s <= step) {
            kept.push_str(&line);
            kept.push('\n');
        }
    }
    let staging = path.with_extension("jsonl.partial");
    std::fs::write(&staging, kept).with_context(|| format!("writing {}", staging.display()))?;
    std::fs::rename(&staging, path).with_context(|| format!("replacing {}", path.display()))
}
