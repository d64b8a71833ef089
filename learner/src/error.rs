//! The crate's error type.

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong learning.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting out of its range, naming it.
    #[error("invalid `{field}`: {message}")]
    Config {
        /// The setting (as in the run config).
        field: &'static str,
        /// What is wrong and what is allowed.
        message: String,
    },
    /// Rewards that do not form the groups they are said to.
    #[error("rewards: {message}")]
    Groups {
        /// What is wrong.
        message: String,
    },
    /// A data file that cannot be used, naming the file and line (0: the file itself).
    #[error("{}:{line}: {message}", path.display())]
    Data {
        /// The file.
        path: std::path::PathBuf,
        /// The line (1-based; 0 for the whole file).
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// A model, weights or tokenizer problem.
    #[error(transparent)]
    Model(#[from] grpo_model::Error),
    /// The rollout engine failed.
    #[error(transparent)]
    Rollout(#[from] grpo_rollout::Error),
    /// A reward failed (under `on_error = "fail"`).
    #[error(transparent)]
    Reward(#[from] grpo_reward::Error),
    /// A rollout worker could not be reached, refused or failed a call.
    #[error("rollout worker {endpoint}: {message}")]
    Worker {
        /// The worker's address.
        endpoint: String,
        /// What went wrong.
        message: String,
    },
    /// The rollout fleet cannot go on (no worker ready, a registry that
    /// cannot listen).
    #[error("rollout fleet: {message}")]
    Fleet {
        /// What is wrong, with each worker's state.
        message: String,
    },
    /// The output folder cannot take this run (another run is there, or
    /// there is nothing to resume).
    #[error("{}: {message}", dir.display())]
    Output {
        /// The output folder.
        dir: std::path::PathBuf,
        /// What is wrong and what to do.
        message: String,
    },
    /// The `[environment]` table cannot be used, its plug-in did not
    /// start, or it faulted under `on_error = "fail"`.
    #[error(transparent)]
    Environment(#[from] grpo_env::Error),
    /// A traced program failed to build or run.
    #[error(transparent)]
    Xla(#[from] grpo_xla::Error),
}
