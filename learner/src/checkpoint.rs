//! Checkpoints: `OUT/checkpoint-<step>/` holds the policy as a Hugging Face
//! folder (config.json, model.safetensors in f32, tokenizer files — what
//! transformers loads) or, when adapters train, as a PEFT adapter folder
//! (adapter_config.json, adapter_model.safetensors in f32, tokenizer files —
//! what `PeftModel.from_pretrained` loads over the base model),
//! `optimizer.safetensors` (the optimizer state by its names) and
//! `trainer_state.json` (the loop's state: step, data position, RNG seeds,
//! statistics — whatever the loop serializes).
//!
//! Writing is atomic and durable: everything goes into a temporary sibling
//! folder whose files and folder are synced to disk before it is renamed
//! into place, and the parent folder is synced after, so a crash or power
//! loss leaves the previous checkpoints intact and never a half-written one
//! under the final name. [`newest_first`] lists the complete checkpoints
//! for `--resume`; [`set_aside`] moves an unreadable one out of their way.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use grpo_model::config::ModelConfig;
use grpo_model::lora::AdapterFolder;
use grpo_model::tokenizer::Tokenizer;
use grpo_model::weights::{HostTensor, Safetensors, SaveDtype, SaveOptions, WeightSource, save_safetensors};

use crate::error::{Error, Result};

/// The optimizer state's file in a checkpoint.
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
/// The loop state's file in a checkpoint.
pub const STATE_FILE: &str = "trainer_state.json";

/// What a checkpoint holds, as the loop hands it over.
pub struct CheckpointParts<'a> {
    /// The step just completed.
    pub step: u64,
    /// The model.
    pub model: SavedModel<'a>,
    /// The policy's trained weights.
    pub policy: SavedPolicy,
    /// Optimizer state with its names, on the host.
    pub optimizer: Vec<(String, HostTensor)>,
    /// The loop's state.
    pub state: serde_json::Value,
}

/// The model a policy is saved as: its config, its tokenizer (whose files
/// are copied in) and its name (the base an adapter folder records).
#[derive(Clone, Copy)]
pub struct SavedModel<'a> {
    /// The model's config.
    pub config: &'a ModelConfig,
    /// The tokenizer.
    pub tokenizer: &'a Tokenizer,
    /// The model's name or path, as the run's config gives it.
    pub name: &'a str,
    /// How a whole model's weights are written (checkpoints write f32 whatever it says).
    pub options: SaveOptions,
}

/// A policy as it is saved.
pub enum SavedPolicy {
    /// The whole model's parameters with their names: a Hugging Face folder.
    Model(Vec<(String, HostTensor)>),
    /// Adapters: a PEFT folder over the base model.
    Adapters(AdapterFolder),
}

impl SavedPolicy {
    /// Writes the policy of `model` into folder `dir` (with the tokenizer's files).
    fn write(&self, dir: &Path, model: SavedModel<'_>) -> Result<()> {
        match self {
            SavedPolicy::Model(params) => {
                let tensors: BTreeMap<_, _> = params.iter().cloned().collect();
                let config = model.config;
                grpo_model::pretrained::write_model_dir(
                    dir,
                    &config.to_hf_json(),
                    config,
                    &tensors,
                    model.tokenizer,
                    model.options,
                )?;
            }
            SavedPolicy::Adapters(folder) => {
                folder.write(dir, model.config, model.name)?;
                model.tokenizer.save(dir)?;
            }
        }
        Ok(())
    }
}

/// A checkpoint's training state read back; its parameters are a model
/// folder, read with `Pretrained::open(dir)` like any other (or an adapter
/// folder, read with `AdapterFolder::read`).
#[derive(Debug)]
pub struct LoadedCheckpoint {
    /// Its folder.
    pub dir: PathBuf,
    /// Optimizer state by name.
    pub optimizer: BTreeMap<String, HostTensor>,
    /// The loop's state.
    pub state: serde_json::Value,
}

fn io(path: &Path, what: &str, e: std::io::Error) -> Error {
    Error::Data {
        path: path.to_path_buf(),
        line: 0,
        message: format!("cannot {what}: {e}"),
    }
}

/// The folder of step `step`'s checkpoint under `out`.
pub fn checkpoint_dir(out: &Path, step: u64) -> PathBuf {
    out.join(format!("checkpoint-{step}"))
}

/// Writes `parts` as `OUT/checkpoint-<step>/`, atomically; returns the folder.
pub fn save(out: &Path, parts: &CheckpointParts<'_>) -> Result<PathBuf> {
    let dir = checkpoint_dir(out, parts.step);
    let staging = out.join(format!(".checkpoint-{}.partial-{}", parts.step, std::process::id()));
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(|e| io(&staging, "clear", e))?;
    }
    // f32 whatever the final folder's dtype: a resumed run starts exactly where this one stopped.
    let model = SavedModel {
        options: SaveOptions {
            dtype: SaveDtype::F32,
            ..parts.model.options
        },
        ..parts.model
    };
    parts.policy.write(&staging, model)?;
    let optimizer: BTreeMap<_, _> = parts.optimizer.iter().cloned().collect();
    save_safetensors(staging.join(OPTIMIZER_FILE), &optimizer)?;
    let state_path = staging.join(STATE_FILE);
    let text = serde_json::to_string_pretty(&parts.state).map_err(|e| Error::Data {
        path: state_path.clone(),
        line: 0,
        message: e.to_string(),
    })?;
    std::fs::write(&state_path, text).map_err(|e| io(&state_path, "write", e))?;
    move_into_place(&staging, &dir)?;
    Ok(dir)
}

/// Syncs the files of folder `staging` and the folder itself, replaces
/// `dir` with it, and syncs their parent.
fn move_into_place(staging: &Path, dir: &Path) -> Result<()> {
    let entries = std::fs::read_dir(staging).map_err(|e| io(staging, "list", e))?;
    for entry in entries {
        let path = entry.map_err(|e| io(staging, "list", e))?.path();
        sync(&path)?;
    }
    sync(staging)?;
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| io(dir, "replace", e))?;
    }
    std::fs::rename(staging, dir).map_err(|e| io(dir, "move into place", e))?;
    sync(dir.parent().unwrap_or(Path::new(".")))
}

/// Flushes file or folder `path` to the disk.
fn sync(path: &Path) -> Result<()> {
    std::fs::File::open(path)
        .and_then(|file| file.sync_all())
        .map_err(|e| io(path, "sync", e))
}

/// Writes the policy alone as a Hugging Face (or PEFT adapter) folder at
/// `dir` (e.g. `OUT/final/`), atomically through a staging sibling.
pub fn save_model(dir: &Path, model: SavedModel<'_>, policy: &SavedPolicy) -> Result<()> {
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("model");
    let staging = dir.with_file_name(format!(".{name}.partial-{}", std::process::id()));
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(|e| io(&staging, "clear", e))?;
    }
    policy.write(&staging, model)?;
    move_into_place(&staging, dir)
}

/// The complete checkpoints under `out` with their steps, oldest first.
fn complete(out: &Path) -> Vec<(u64, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(out) else {
        return Vec::new();
    };
    let mut found: Vec<(u64, PathBuf)> = entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let step: u64 = name.strip_prefix("checkpoint-")?.parse().ok()?;
            entry.path().join(STATE_FILE).is_file().then(|| (step, entry.path()))
        })
        .collect();
    found.sort();
    found
}

/// The newest complete checkpoint under `out`, if any.
pub fn latest(out: &Path) -> Option<PathBuf> {
    complete(out).pop().map(|(_, path)| path)
}

/// The complete checkpoints under `out`, newest first.
pub fn newest_first(out: &Path) -> Vec<PathBuf> {
    complete(out).into_iter().rev().map(|(_, path)| path).collect()
}

/// Renames checkpoint folder `dir`, found unreadable, to
/// `<dir>.unreadable` (kept for inspection; no longer a checkpoint that
/// resuming or pruning would take); returns the new path.
pub fn set_aside(dir: &Path) -> Result<PathBuf> {
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("checkpoint");
    let aside = dir.with_file_name(format!("{name}.unreadable"));
    if aside.exists() {
        std::fs::remove_dir_all(&aside).map_err(|e| io(&aside, "replace", e))?;
    }
    std::fs::rename(dir, &aside).map_err(|e| io(dir, "set aside", e))?;
    Ok(aside)
}

/// Deletes all but the newest `keep` complete checkpoints under `out`
/// (`keep` 0 keeps all) and any staging folder a crashed write left;
/// returns how many checkpoints went.
pub fn prune(out: &Path, keep: usize) -> Result<usize> {
    if let Ok(entries) = std::fs::read_dir(out) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(".checkpoint-") && name.contains(".partial-") {
                std::fs::remove_dir_all(entry.path()).map_err(|e| io(&entry.path(), "remove", e))?;
            }
        }
    }
    let found = complete(out);
    if keep == 0 || found.len() <= keep {
        return Ok(0);
    }
    let old = &found[..found.len() - keep];
    for (_, dir) in old {
        std::fs::remove_dir_all(dir).map_err(|e| io(dir, "remove", e))?;
    }
    Ok(old.len())
}

/// Reads a checkpoint folder's optimizer and loop state back.
pub fn load(dir: &Path) -> Result<LoadedCheckpoint> {
    let read_all = |source: &dyn WeightSource| -> Result<BTreeMap<String, HostTensor>> {
        source
            .names()
            .into_iter()
            .map(|name| {
                let tensor = source.tensor(&name)?;
                Ok((name, tensor))
            })
            .collect()
    };
    let optimizer = read_all(&Safetensors::open_files(&[dir.join(OPTIMIZER_FILE)])?)?;
    let state_path = dir.join(STATE_FILE);
    let text = std::fs::read_to_string(&state_path).map_err(|e| io(&state_path, "read", e))?;
    let state = serde_json::from_str(&text).map_err(|e| Error::Data {
        path: state_path.clone(),
        line: e.line(),
        message: e.to_string(),
    })?;
    Ok(LoadedCheckpoint {
        dir: dir.to_path_buf(),
        optimizer,
        state,
    })
}
