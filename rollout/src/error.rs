//! The crate's error type.

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong generating.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request the engine cannot serve, and why.
    #[error("request {index}: {message}")]
    InvalidRequest {
        /// Position of the request in the call.
        index: usize,
        /// What is wrong.
        message: String,
    },
    /// The model could not be used.
    #[error(transparent)]
    Model(#[from] grpo_model::Error),
    /// A program or the runtime failed.
    #[error(transparent)]
    Xla(#[from] grpo_xla::Error),
}
