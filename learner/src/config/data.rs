//! `[model]` and `[data]`: the policy and the prompts.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::data::{Example, load_jsonl, split, to_chat};
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
    /// A JSONL file of prompts, relative to the config file. Required.
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
    /// A JSONL file of eval prompts (same columns), relative to the config
    /// file; without it `eval_size` rows of `path` are held out. Default none.
    #[serde(default)]
    pub eval_path: Option<PathBuf>,
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
        let read = |path: &Path| -> Result<Vec<Example>> {
            let rows = load_jsonl(path, &self.prompt_column)?;
            Ok(to_chat(rows, self.as_chat, self.system_prompt.as_deref()))
        };
        let rows = read(&self.path)?;
        match &self.eval_path {
            Some(path) => {
                let mut eval = read(path)?;
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
