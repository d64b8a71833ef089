//! The rows of a dataset as users have it, each a JSON object: a JSONL
//! file, a Parquet file, an Arrow file (`datasets`' format), or a folder
//! laid out as a Hugging Face dataset — as on the Hub (`data/<split>-*.parquet`,
//! `<split>-*.parquet`, `<split>.parquet`, `<split>/*.parquet`, the same with
//! `.jsonl`) or as `datasets.save_to_disk` writes it (`dataset_dict.json`
//! with a folder per split, or one split's `state.json` and `.arrow` files).
//! Columnar rows become JSON through arrow-json: chat messages (lists of
//! structs) become lists of objects, nulls inside them are left out.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use arrow_array::RecordBatch;
use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// One row and where it came from (for errors).
#[derive(Debug, Clone)]
pub struct Row {
    /// The file.
    pub file: PathBuf,
    /// Its line (JSONL) or row (Parquet, Arrow), 1-based.
    pub number: usize,
    /// Its columns.
    pub columns: Map<String, Value>,
}

/// The rows of `path`'s `split` (used only when `path` is a folder).
pub fn read_rows(path: &Path, split: &str) -> Result<Vec<Row>> {
    let files = if path.is_dir() {
        split_files(path, split)?
    } else {
        vec![path.to_path_buf()]
    };
    let mut rows = Vec::new();
    for file in files {
        rows.extend(read_file(&file)?);
    }
    Ok(rows)
}

/// The files of `split` in the dataset folder `dir`.
fn split_files(dir: &Path, split: &str) -> Result<Vec<PathBuf>> {
    if dir.join("dataset_dict.json").is_file() {
        let folder = dir.join(split);
        if !folder.is_dir() {
            return Err(fail(
                dir,
                0,
                format!("no split `{split}` (splits here: {})", subfolders(dir).join(", ")),
            ));
        }
        return saved_split(&folder);
    }
    if dir.join("state.json").is_file() {
        return saved_split(dir);
    }
    for folder in [dir.join("data"), dir.to_path_buf()] {
        for extension in ["parquet", "jsonl"] {
            let mut files = listed(&folder, |name| {
                name.strip_suffix(&format!(".{extension}"))
                    .is_some_and(|stem| stem == split || stem.starts_with(&format!("{split}-")))
            });
            if files.is_empty() {
                files = listed(&folder.join(split), |name| name.ends_with(&format!(".{extension}")));
            }
            if !files.is_empty() {
                return Ok(files);
            }
        }
    }
    Err(fail(
        dir,
        0,
        format!(
            "no `{split}` split: looked for data/{split}-*.parquet, {split}-*.parquet, {split}.parquet, \
             {split}/*.parquet (or .jsonl), and the dataset_dict.json or state.json of datasets.save_to_disk; \
             set `[data] split` to one the folder has"
        ),
    ))
}

/// The `.arrow` files of a split saved by `datasets.save_to_disk`, in
/// the order its `state.json` lists them.
fn saved_split(folder: &Path) -> Result<Vec<PathBuf>> {
    let state = folder.join("state.json");
    let text = std::fs::read_to_string(&state).map_err(|e| fail(&state, 0, format!("cannot read: {e}")))?;
    let state: Value = serde_json::from_str(&text).map_err(|e| fail(&state, 0, format!("not JSON: {e}")))?;
    let files: Vec<PathBuf> = state["_data_files"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|file| file["filename"].as_str())
        .map(|name| folder.join(name))
        .collect();
    match files.is_empty() {
        true => Ok(listed(folder, |name| name.ends_with(".arrow"))),
        false => Ok(files),
    }
}

/// The files of `folder` whose names pass `keep`, sorted.
fn listed(folder: &Path, keep: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.is_file() && path.file_name().and_then(|n| n.to_str()).is_some_and(&keep))
        .collect();
    files.sort();
    files
}

/// The names of `dir`'s folders, sorted.
fn subfolders(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| entry.path().is_dir())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The rows of one file, read by its extension.
fn read_file(file: &Path) -> Result<Vec<Row>> {
    let extension = file.extension().and_then(|e| e.to_str()).unwrap_or_default();
    match extension {
        "parquet" => batch_rows(file, parquet_batches(file)?),
        "arrow" => batch_rows(file, arrow_batches(file)?),
        _ => jsonl_rows(file),
    }
}

/// The rows of a JSONL file; blank lines are skipped.
fn jsonl_rows(file: &Path) -> Result<Vec<Row>> {
    let opened = std::fs::File::open(file).map_err(|e| fail(file, 0, format!("cannot open: {e}")))?;
    let mut rows = Vec::new();
    for (index, line) in std::io::BufReader::new(opened).lines().enumerate() {
        let number = index + 1;
        let line = line.map_err(|e| fail(file, number, e.to_string()))?;
        if line.trim().is_empty() {
            continue;
        }
        let columns = match serde_json::from_str(&line) {
            Ok(Value::Object(columns)) => columns,
            Ok(_) => return Err(fail(file, number, "a row must be a JSON object".to_string())),
            Err(e) => return Err(fail(file, number, format!("not JSON: {e}"))),
        };
        rows.push(Row {
            file: file.to_path_buf(),
            number,
            columns,
        });
    }
    Ok(rows)
}

/// The record batches of a Parquet file.
fn parquet_batches(file: &Path) -> Result<Vec<RecordBatch>> {
    let bad = |e: String| fail(file, 0, format!("cannot read as Parquet: {e}"));
    let opened = std::fs::File::open(file).map_err(|e| fail(file, 0, format!("cannot open: {e}")))?;
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(opened)
        .and_then(|builder| builder.build())
        .map_err(|e| bad(e.to_string()))?;
    reader.map(|batch| batch.map_err(|e| bad(e.to_string()))).collect()
}

/// The record batches of an Arrow IPC stream file (what `datasets` writes).
fn arrow_batches(file: &Path) -> Result<Vec<RecordBatch>> {
    let bad = |e: String| fail(file, 0, format!("cannot read as an Arrow stream: {e}"));
    let opened = std::fs::File::open(file).map_err(|e| fail(file, 0, format!("cannot open: {e}")))?;
    let reader = arrow_ipc::reader::StreamReader::try_new(std::io::BufReader::new(opened), None)
        .map_err(|e| bad(e.to_string()))?;
    reader.map(|batch| batch.map_err(|e| bad(e.to_string()))).collect()
}

/// `batches`' rows as JSON objects, numbered from 1.
fn batch_rows(file: &Path, batches: Vec<RecordBatch>) -> Result<Vec<Row>> {
    let mut writer = arrow_json::ArrayWriter::new(Vec::new());
    for batch in &batches {
        writer
            .write(batch)
            .map_err(|e| fail(file, 0, format!("cannot convert to JSON: {e}")))?;
    }
    writer
        .finish()
        .map_err(|e| fail(file, 0, format!("cannot convert to JSON: {e}")))?;
    let bytes = writer.into_inner();
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    let values: Vec<Map<String, Value>> =
        serde_json::from_slice(&bytes).map_err(|e| fail(file, 0, format!("cannot convert to JSON: {e}")))?;
    Ok(values
        .into_iter()
        .enumerate()
        .map(|(index, columns)| Row {
            file: file.to_path_buf(),
            number: index + 1,
            columns,
        })
        .collect())
}

fn fail(file: &Path, line: usize, message: String) -> Error {
    Error::Data {
        path: file.to_path_buf(),
        line,
        message,
    }
}
