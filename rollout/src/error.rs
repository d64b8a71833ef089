//! The crate's error type.

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong generating.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request the engine cannot serve, and why; the engine keeps serving others.
    #[error("invalid request: {message}")]
    InvalidRequest {
        /// What is wrong.
        message: String,
    },
    /// A request whose structured output's grammar does not compile; the
    /// engine keeps serving others.
    #[error("the structured output's grammar is invalid: {message}")]
    InvalidGuide {
        /// llguidance's reason.
        message: String,
    },
    /// A weight update the engine refused; it keeps its old weights.
    #[error("weight update to version {version} refused: {message}")]
    InvalidUpdate {
        /// The version the update would have installed.
        version: u64,
        /// What is wrong.
        message: String,
    },
    /// [`crate::engine::Engine::generate`] was called while requests added
    /// one by one are still running.
    #[error("the engine is busy with {requests} requests added with add_request; drive it with step()")]
    Busy {
        /// How many.
        requests: usize,
    },
    /// The engine's thread has stopped (after a device failure, or because
    /// every handle was dropped); nothing more can be generated.
    #[error("the engine has stopped: {reason}")]
    EngineStopped {
        /// Why.
        reason: String,
    },
    /// The model could not be used.
    #[error(transparent)]
    Model(#[from] grpo_model::Error),
    /// A program or the runtime failed.
    #[error(transparent)]
    Xla(#[from] grpo_xla::Error),
}
