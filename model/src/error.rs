//! The crate's error type: one enum, each variant naming the file, tensor
//! or field that is wrong.

use std::path::PathBuf;

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong reading models, tokenizers and templates.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or writing a file failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file is not what its format says (corrupt, truncated, unsupported version).
    #[error("{path}: {message}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong, and where in the file.
        message: String,
    },
    /// A tensor is missing, has the wrong shape, or a dtype grpo cannot read.
    #[error("{path}: tensor `{tensor}`: {message}")]
    Tensor {
        /// The file holding (or expected to hold) the tensor.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// What is wrong.
        message: String,
    },
    /// A model configuration grpo does not support.
    #[error("config `{field}`: {message}")]
    Config {
        /// The field (or architecture) at fault.
        field: String,
        /// What is wrong and what is supported.
        message: String,
    },
    /// Building or running a tokenizer failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// Parsing or rendering a chat template failed.
    #[error("chat template: {0}")]
    Template(String),
    /// A traced program or the runtime failed.
    #[error(transparent)]
    Xla(#[from] grpo_xla::Error),
}

impl Error {
    /// An [`Error::Io`] for `path`.
    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            action,
            path: path.into(),
            source,
        }
    }

    /// An [`Error::Format`] for `path`.
    pub fn format(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Error::Format {
            path: path.into(),
            message: message.into(),
        }
    }
}
