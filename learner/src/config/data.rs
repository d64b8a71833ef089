//! `[model]` and `[data]`: the policy and the prompts.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::data::{Example, load_examples, split, to_chat};
use crate::error::Result;

/// `[model]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// A model folder or a .gguf file (relative to the working directory,
    /// not to the config file), or `smollm2-135m-instruct`. Required.
    pub name: String,
    /// A Jinja chat template file used instead of the model's own (for
    /// instance one that renders `tools`), relative to the config file; it
    /// is saved with the trained model. Default: the model's.
    #[serde(default)]
    pub chat_template: Option<PathBuf>,
}

impl ModelSection {
    /// The chat template file's path relative to `base`.
    pub fn rebase(&mut self, base: &Path) {
        if let Some(path) = &self.chat_template {
            self.chat_template = Some(base.join(path));
        }
    }
}

/// `[data]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataSection {
    /// The prompts, relative to the config file: a JSONL, Parquet or Arrow
    /// file, or a Hugging Face dataset folder ([`crate::dataset`]). Required.
    pub path: PathBuf,
    /// The column holding the prompt (text or chat turns). Default "prompt".
    #[serde(default = "default_prompt_column")]
    pub prompt_column: String,
    /// Text prompts become one user turn (rendered with the chat template). Default false.
    #[serde(default)]
    pub as_chat: bool,
    /// A system turn put before chat prompts that have none. Default none.
    #[serde(default)]
    pub system_prompt: Option<String>,
    /// The split of `path` when it is a dataset folder (TRL's
    /// `dataset_train_split`). Default "train".
    #[serde(default = "default_split", alias = "dataset_train_split")]
    pub split: String,
    /// Eval prompts (same columns) in a file or dataset folder, relative to
    /// the config file; without it (and without `eval_split`) `eval_size`
    /// rows of `path` are held out. Default none.
    #[serde(default)]
    pub eval_path: Option<PathBuf>,
    /// The split of `eval_path` (or, without it, of `path`) the eval prompts
    /// come from (TRL's `dataset_test_split`). Default none: "test" for an
    /// `eval_path` folder.
    #[serde(default, alias = "dataset_test_split")]
    pub eval_split: Option<String>,
    /// Rows held out for evaluation (with `eval_path`: its first rows; 0 = all). Default 0.
    #[serde(default)]
    pub eval_size: usize,
    /// The seed of the split and of the prompt order. Default 0.
    #[serde(default)]
    pub seed: u64,
}

impl DataSection {
    /// The train and eval rows.
    pub fn load(&self) -> Result<(Vec<Example>, Vec<Example>)> {
        let read = |path: &Path, split: &str| -> Result<Vec<Example>> {
            let rows = load_examples(path, split, &self.prompt_column)?;
            Ok(to_chat(rows, self.as_chat, self.system_prompt.as_deref()))
        };
        let rows = read(&self.path, &self.split)?;
        let eval_source = match (&self.eval_path, &self.eval_split) {
            (Some(path), split) => Some((path, split.as_deref().unwrap_or("test"))),
            (None, Some(split)) => Some((&self.path, split.as_str())),
            (None, None) => None,
        };
        match eval_source {
            Some((path, split)) => {
                let mut eval = read(path, split)?;
                if self.eval_size > 0 {
                    eval.truncate(self.eval_size);
                }
                Ok((rows, eval))
            }
            None => split(rows, self.eval_size, self.seed),
        }
    }
}

fn default_prompt_column() -> String {
    "prompt".to_string()
}

/// The train split of a dataset folder.
pub(crate) fn default_split() -> String {
    "train".to_string()
}
