//! The rollout log of `grpo run`: every sampled completion of every step,
//! one row each, in `OUT/rollouts.parquet`.
//!
//! That path is a Parquet *dataset folder* (as Spark and pyarrow write
//! them): one part file per step, `step-000012.parquet`, which
//! `pandas.read_parquet("OUT/rollouts.parquet")` and `pyarrow.dataset`
//! read as one table. Each part is written to a hidden temp file in the
//! same folder (`.step-000012.parquet.tmp`, a name dataset readers skip),
//! synced, then renamed into place, so a crash never leaves a torn part
//! and the log only grows. A resumed run first drops the parts of steps
//! after its checkpoint ([`RolloutLog::truncate_after`]), since it will
//! produce those rows again.
//!
//! Columns: `step`, `policy_version` (u64), `group`, `sample` (u32),
//! `prompt`, `completion` (utf8), `reward` (f32, null when the reward
//! failed), `advantage` (f32), `completion_tokens` (u32), `finish_reason`
//! (utf8: `stop`, `length` or `abort`), `columns` (utf8: the dataset row's
//! other columns as JSON text), and for the episodes of a multi-turn run
//! (null otherwise): `messages` (utf8: the transcript after the prompt as
//! JSON, OpenAI's shape with `tool` roles and `tool_calls`), `token_ids`
//! (list of u32: every token after the prompt), `loss_mask` (list of bool:
//! the model's own tokens), `turns` and `tool_calls` (u32), `episode_end`
//! (utf8: `done`, `max_turns` or `token_budget`). Parts are
//! Snappy-compressed; parts written before the episode columns existed
//! read back with them null.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::builder::{BooleanBuilder, ListBuilder, UInt32Builder};
use arrow_array::{
    Array, ArrayRef, BooleanArray, Float32Array, ListArray, RecordBatch, StringArray, UInt32Array, UInt64Array,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;

use crate::error::{Error, Result};

/// The log's folder name under a run's output folder.
pub const DIR_NAME: &str = "rollouts.parquet";

/// One sampled completion of one step.
#[derive(Debug, Clone, PartialEq)]
pub struct RolloutRow {
    /// The training step (0-based) that sampled it.
    pub step: u64,
    /// The version of the policy weights that sampled it.
    pub policy_version: u64,
    /// Its group (one prompt) within the step.
    pub group: u32,
    /// Its index within the group.
    pub sample: u32,
    /// The prompt as given to the model (after the chat template).
    pub prompt: String,
    /// The sampled completion text.
    pub completion: String,
    /// Its reward; `None` when the reward failed.
    pub reward: Option<f32>,
    /// Its group-relative advantage.
    pub advantage: f32,
    /// Tokens in the completion.
    pub completion_tokens: u32,
    /// Why sampling ended: `stop`, `length` or `abort`.
    pub finish_reason: String,
    /// The dataset row's other columns as JSON text (e.g. `{"answer":"4"}`).
    pub columns: String,
    /// The episode, in a multi-turn run.
    pub episode: Option<EpisodeRecord>,
}

/// What the log keeps of an episode besides its row's other fields.
#[derive(Debug, Clone, PartialEq)]
pub struct EpisodeRecord {
    /// The messages after the prompt as a JSON array (OpenAI's shape).
    pub messages: String,
    /// Every token after the prompt.
    pub token_ids: Vec<u32>,
    /// Which of them the model sampled.
    pub loss_mask: Vec<bool>,
    /// Model turns.
    pub turns: u32,
    /// Tool calls made.
    pub tool_calls: u32,
    /// Why it ended (`done`, `max_turns`, `token_budget`).
    pub end: String,
}

/// The rollout log of a run: a Parquet dataset folder of one part per step.
#[derive(Debug, Clone)]
pub struct RolloutLog {
    dir: PathBuf,
    schema: SchemaRef,
}

impl RolloutLog {
    /// Opens the log of the run writing to `out`: `out/rollouts.parquet/`,
    /// created (with `out`) if needed. Existing parts are kept.
    pub fn open(out: &Path) -> Result<RolloutLog> {
        let dir = out.join(DIR_NAME);
        std::fs::create_dir_all(&dir).map_err(|e| io_error(&dir, "creating the folder", &e))?;
        Ok(RolloutLog { dir, schema: schema() })
    }

    /// The dataset folder, `OUT/rollouts.parquet`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path of the part of `step`: `step-000012.parquet`.
    pub fn part_path(&self, step: u64) -> PathBuf {
        self.dir.join(part_name(step))
    }

    /// Writes the rows of `step` as its part, atomically (hidden temp file,
    /// sync, rename, sync of the folder), and returns the part's path.
    /// Every row must carry `step`; a step's part is written once (a
    /// resumed run calls [`RolloutLog::truncate_after`] first). An empty
    /// `rows` writes a part with no rows.
    pub fn append(&self, step: u64, rows: &[RolloutRow]) -> Result<PathBuf> {
        let path = self.part_path(step);
        if let Some(i) = rows.iter().position(|r| r.step != step) {
            return Err(Error::Data {
                path,
                line: i + 1,
                message: format!("row {} has step {} in the part of step {step}", i + 1, rows[i].step),
            });
        }
        if path.exists() {
            return Err(Error::Data {
                path,
                line: 0,
                message: format!(
                    "the part of step {step} already exists (the log only grows; a resumed run \
                     truncates it after its checkpoint first)"
                ),
            });
        }
        let batch = to_batch(&self.schema, rows).map_err(|e| data_error(&path, &e))?;
        let tmp = self.dir.join(format!(".{}{TMP_SUFFIX}", part_name(step)));
        let written = write_part(&tmp, &self.schema, &batch);
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        std::fs::rename(&tmp, &path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io_error(&path, "renaming the part into place", &e)
        })?;
        sync_dir(&self.dir)?;
        Ok(path)
    }

    /// For `--resume` from the checkpoint of `step`: removes the parts of
    /// steps after `step` (rows the resumed run will produce again) and any
    /// temp files a crash left; returns how many parts it removed.
    pub fn truncate_after(&self, step: u64) -> Result<usize> {
        let mut removed = 0;
        for (name, path) in read_dir(&self.dir)? {
            let stale = match parse_part_name(&name) {
                Some(s) => s > step,
                None => is_temp_name(&name),
            };
            if !stale {
                continue;
            }
            std::fs::remove_file(&path).map_err(|e| io_error(&path, "removing", &e))?;
            if !is_temp_name(&name) {
                removed += 1;
            }
        }
        sync_dir(&self.dir)?;
        Ok(removed)
    }
}

/// Reads every part of the dataset folder `dir` back, in step order (rows
/// within a part in the order written). Temp files and other hidden files
/// are skipped, as dataset readers do.
pub fn read_rollouts(dir: &Path) -> Result<Vec<RolloutRow>> {
    let mut parts: Vec<(u64, PathBuf)> = read_dir(dir)?
        .into_iter()
        .filter_map(|(name, path)| parse_part_name(&name).map(|s| (s, path)))
        .collect();
    parts.sort();
    let mut rows = Vec::new();
    for (step, path) in parts {
        let part = read_part(&path)?;
        if let Some(i) = part.iter().position(|r| r.step != step) {
            return Err(Error::Data {
                path,
                line: i + 1,
                message: format!("row {} has step {} in the part of step {step}", i + 1, part[i].step),
            });
        }
        rows.extend(part);
    }
    Ok(rows)
}

const TMP_SUFFIX: &str = ".tmp";

fn part_name(step: u64) -> String {
    format!("step-{step:06}.parquet")
}

/// The step of a part's file name, `None` for any other name.
fn parse_part_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("step-")?.strip_suffix(".parquet")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

fn is_temp_name(name: &str) -> bool {
    name.starts_with(".step-") && name.ends_with(TMP_SUFFIX)
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("step", DataType::UInt64, false),
        Field::new("policy_version", DataType::UInt64, false),
        Field::new("group", DataType::UInt32, false),
        Field::new("sample", DataType::UInt32, false),
        Field::new("prompt", DataType::Utf8, false),
        Field::new("completion", DataType::Utf8, false),
        Field::new("reward", DataType::Float32, true),
        Field::new("advantage", DataType::Float32, false),
        Field::new("completion_tokens", DataType::UInt32, false),
        Field::new("finish_reason", DataType::Utf8, false),
        Field::new("columns", DataType::Utf8, false),
        Field::new("messages", DataType::Utf8, true),
        Field::new_list("token_ids", Field::new_list_field(DataType::UInt32, false), true),
        Field::new_list("loss_mask", Field::new_list_field(DataType::Boolean, false), true),
        Field::new("turns", DataType::UInt32, true),
        Field::new("tool_calls", DataType::UInt32, true),
        Field::new("episode_end", DataType::Utf8, true),
    ]))
}

fn to_batch(schema: &SchemaRef, rows: &[RolloutRow]) -> std::result::Result<RecordBatch, String> {
    let u64s = |f: fn(&RolloutRow) -> u64| -> ArrayRef { Arc::new(rows.iter().map(f).collect::<UInt64Array>()) };
    let u32s = |f: fn(&RolloutRow) -> u32| -> ArrayRef { Arc::new(rows.iter().map(f).collect::<UInt32Array>()) };
    let strs =
        |f: fn(&RolloutRow) -> &str| -> ArrayRef { Arc::new(rows.iter().map(|r| Some(f(r))).collect::<StringArray>()) };
    let columns: Vec<ArrayRef> = vec![
        u64s(|r| r.step),
        u64s(|r| r.policy_version),
        u32s(|r| r.group),
        u32s(|r| r.sample),
        strs(|r| &r.prompt),
        strs(|r| &r.completion),
        Arc::new(rows.iter().map(|r| r.reward).collect::<Float32Array>()),
        Arc::new(rows.iter().map(|r| r.advantage).collect::<Float32Array>()),
        u32s(|r| r.completion_tokens),
        strs(|r| &r.finish_reason),
        strs(|r| &r.columns),
    ];
    let episodes = || rows.iter().map(|r| r.episode.as_ref());
    let mut token_ids =
        ListBuilder::new(UInt32Builder::new()).with_field(Field::new_list_field(DataType::UInt32, false));
    let mut loss_mask =
        ListBuilder::new(BooleanBuilder::new()).with_field(Field::new_list_field(DataType::Boolean, false));
    for episode in episodes() {
        match episode {
            Some(e) => {
                token_ids.values().append_slice(&e.token_ids);
                token_ids.append(true);
                for &m in &e.loss_mask {
                    loss_mask.values().append_value(m);
                }
                loss_mask.append(true);
            }
            None => {
                token_ids.append(false);
                loss_mask.append(false);
            }
        }
    }
    let mut columns = columns;
    columns.extend([
        Arc::new(
            episodes()
                .map(|e| e.map(|e| e.messages.as_str()))
                .collect::<StringArray>(),
        ) as ArrayRef,
        Arc::new(token_ids.finish()),
        Arc::new(loss_mask.finish()),
        Arc::new(episodes().map(|e| e.map(|e| e.turns)).collect::<UInt32Array>()),
        Arc::new(episodes().map(|e| e.map(|e| e.tool_calls)).collect::<UInt32Array>()),
        Arc::new(episodes().map(|e| e.map(|e| e.end.as_str())).collect::<StringArray>()),
    ]);
    RecordBatch::try_new(schema.clone(), columns).map_err(|e| e.to_string())
}

fn write_part(tmp: &Path, schema: &SchemaRef, batch: &RecordBatch) -> Result<()> {
    let file = File::create(tmp).map_err(|e| io_error(tmp, "creating", &e))?;
    let props = WriterProperties::builder().set_compression(Compression::SNAPPY).build();
    let mut writer = ArrowWriter::try_new(file, schema.clone(), Some(props)).map_err(|e| data_error(tmp, &e))?;
    writer.write(batch).map_err(|e| data_error(tmp, &e))?;
    let file = writer.into_inner().map_err(|e| data_error(tmp, &e))?;
    file.sync_all().map_err(|e| io_error(tmp, "syncing", &e))
}

/// The rows of one part; a row's error names it as the line (1-based).
fn read_part(path: &Path) -> Result<Vec<RolloutRow>> {
    let file = File::open(path).map_err(|e| io_error(path, "opening", &e))?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .and_then(|b| b.build())
        .map_err(|e| data_error(path, &e))?;
    let mut rows = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| data_error(path, &e))?;
        let cols = Columns::of(&batch, path)?;
        for i in 0..batch.num_rows() {
            let line = rows.len() + 1;
            let row = cols.row(i).map_err(|message| Error::Data {
                path: path.to_path_buf(),
                line,
                message,
            })?;
            rows.push(row);
        }
    }
    Ok(rows)
}

/// A batch's columns, each downcast to its type.
struct Columns<'a> {
    step: &'a UInt64Array,
    policy_version: &'a UInt64Array,
    group: &'a UInt32Array,
    sample: &'a UInt32Array,
    prompt: &'a StringArray,
    completion: &'a StringArray,
    reward: &'a Float32Array,
    advantage: &'a Float32Array,
    completion_tokens: &'a UInt32Array,
    finish_reason: &'a StringArray,
    columns: &'a StringArray,
    /// The episode columns (absent in parts written before they existed).
    episodes: Option<EpisodeColumns<'a>>,
}

/// The episode columns of a batch.
struct EpisodeColumns<'a> {
    messages: &'a StringArray,
    token_ids: &'a ListArray,
    loss_mask: &'a ListArray,
    turns: &'a UInt32Array,
    tool_calls: &'a UInt32Array,
    end: &'a StringArray,
}

impl<'a> Columns<'a> {
    fn of(batch: &'a RecordBatch, path: &Path) -> Result<Columns<'a>> {
        fn get<'b, T: 'static>(batch: &'b RecordBatch, name: &str, path: &Path) -> Result<&'b T> {
            let column = batch.column_by_name(name).ok_or_else(|| Error::Data {
                path: path.to_path_buf(),
                line: 0,
                message: format!("no column `{name}`"),
            })?;
            column.as_any().downcast_ref::<T>().ok_or_else(|| Error::Data {
                path: path.to_path_buf(),
                line: 0,
                message: format!("column `{name}` has type {}", column.data_type()),
            })
        }
        Ok(Columns {
            step: get(batch, "step", path)?,
            policy_version: get(batch, "policy_version", path)?,
            group: get(batch, "group", path)?,
            sample: get(batch, "sample", path)?,
            prompt: get(batch, "prompt", path)?,
            completion: get(batch, "completion", path)?,
            reward: get(batch, "reward", path)?,
            advantage: get(batch, "advantage", path)?,
            completion_tokens: get(batch, "completion_tokens", path)?,
            finish_reason: get(batch, "finish_reason", path)?,
            columns: get(batch, "columns", path)?,
            episodes: match batch.column_by_name("messages") {
                None => None,
                Some(_) => Some(EpisodeColumns {
                    messages: get(batch, "messages", path)?,
                    token_ids: get(batch, "token_ids", path)?,
                    loss_mask: get(batch, "loss_mask", path)?,
                    turns: get(batch, "turns", path)?,
                    tool_calls: get(batch, "tool_calls", path)?,
                    end: get(batch, "episode_end", path)?,
                }),
            },
        })
    }

    /// Row `i`; an error names the column holding a null it must not.
    fn row(&self, i: usize) -> std::result::Result<RolloutRow, String> {
        fn value<A: Array, T>(a: &A, i: usize, name: &str, get: impl Fn(&A) -> T) -> std::result::Result<T, String> {
            if a.is_null(i) {
                Err(format!("null `{name}`"))
            } else {
                Ok(get(a))
            }
        }
        Ok(RolloutRow {
            step: value(self.step, i, "step", |a| a.value(i))?,
            policy_version: value(self.policy_version, i, "policy_version", |a| a.value(i))?,
            group: value(self.group, i, "group", |a| a.value(i))?,
            sample: value(self.sample, i, "sample", |a| a.value(i))?,
            prompt: value(self.prompt, i, "prompt", |a| a.value(i).to_owned())?,
            completion: value(self.completion, i, "completion", |a| a.value(i).to_owned())?,
            reward: (!self.reward.is_null(i)).then(|| self.reward.value(i)),
            advantage: value(self.advantage, i, "advantage", |a| a.value(i))?,
            completion_tokens: value(self.completion_tokens, i, "completion_tokens", |a| a.value(i))?,
            finish_reason: value(self.finish_reason, i, "finish_reason", |a| a.value(i).to_owned())?,
            columns: value(self.columns, i, "columns", |a| a.value(i).to_owned())?,
            episode: self.episodes.as_ref().and_then(|e| e.row(i)),
        })
    }
}

impl EpisodeColumns<'_> {
    /// Row `i`'s episode (`None` when its `messages` is null).
    fn row(&self, i: usize) -> Option<EpisodeRecord> {
        if self.messages.is_null(i) {
            return None;
        }
        let list = |a: &ListArray| a.value(i);
        let ids = list(self.token_ids);
        let mask = list(self.loss_mask);
        Some(EpisodeRecord {
            messages: self.messages.value(i).to_owned(),
            token_ids: ids.as_any().downcast_ref::<UInt32Array>()?.values().to_vec(),
            loss_mask: mask
                .as_any()
                .downcast_ref::<BooleanArray>()?
                .iter()
                .map(|m| m == Some(true))
                .collect(),
            turns: self.turns.value(i),
            tool_calls: self.tool_calls.value(i),
            end: self.end.value(i).to_owned(),
        })
    }
}

/// The entries of `dir` as (file name, path); names that are not UTF-8 are skipped.
fn read_dir(dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let entries = std::fs::read_dir(dir).map_err(|e| io_error(dir, "reading the folder", &e))?;
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| io_error(dir, "reading the folder", &e))?;
        if let Ok(name) = entry.file_name().into_string() {
            out.push((name, entry.path()));
        }
    }
    Ok(out)
}

/// Syncs a folder so a rename or removal in it is durable.
fn sync_dir(dir: &Path) -> Result<()> {
    crate::files::sync_dir(dir).map_err(|e| io_error(dir, "syncing the folder", &e))
}

fn io_error(path: &Path, what: &str, e: &std::io::Error) -> Error {
    Error::Data {
        path: path.to_path_buf(),
        line: 0,
        message: format!("{what}: {e}"),
    }
}

fn data_error(path: &Path, e: &dyn std::fmt::Display) -> Error {
    Error::Data {
        path: path.to_path_buf(),
        line: 0,
        message: e.to_string(),
    }
}
