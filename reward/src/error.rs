//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong configuring or running a reward.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The reward configuration could not be read or is invalid.
    #[error("reward config: {0}")]
    Config(String),
    /// A `[[reward]]` entry named a type that is neither built in nor registered.
    #[error(
        "reward {name}: unknown type `{kind}`; use a built-in (math, exact, contains, regex, format, length, countdown, arithmetic, http, command) or register it with Registry::register"
    )]
    UnknownType {
        /// The entry's name.
        name: String,
        /// The unknown type.
        kind: String,
    },
    /// A file could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A regular expression in the config does not compile.
    #[error("reward {name}: bad regex: {source}")]
    Regex {
        /// The entry's name.
        name: String,
        /// The cause.
        source: regex::Error,
    },
    /// A sample lacks what the reward needs (a column, token ids).
    #[error("sample {sample}: {what}")]
    BadSample {
        /// The sample id.
        sample: u64,
        /// What is missing or malformed.
        what: String,
    },
    /// A plug-in call ran past its timeout.
    #[error("timed out after {seconds} s")]
    Timeout {
        /// The timeout.
        seconds: f64,
    },
    /// A plug-in subprocess could not start, exited or closed its pipes.
    #[error("plug-in process: {0}")]
    Crashed(String),
    /// A plug-in answered something that is not a list of scores of the batch's length.
    #[error("bad plug-in output: {0}")]
    BadOutput(String),
    /// An HTTP plug-in request failed after its retries.
    #[error("http: {0}")]
    Http(String),
    /// A reward whose `on_error` is "fail" could not score a sample.
    #[error("reward {reward} failed on sample {sample}: {cause}")]
    Failed {
        /// The reward's name.
        reward: String,
        /// The sample id.
        sample: u64,
        /// What went wrong.
        cause: Box<Error>,
    },
    /// Arithmetic on exact rationals overflowed i128 or divided by zero.
    #[error("arithmetic: {0}")]
    Arithmetic(&'static str),
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
