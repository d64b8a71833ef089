//! What can go wrong serving or calling a rollout worker, beyond the
//! engine's own errors, and the one mapping from engine errors to gRPC
//! status codes.

use std::net::SocketAddr;

use tonic::{Code, Status};

use grpo_rollout::Error;

/// Why a worker could not serve, or a call to one failed.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// A gRPC server (a worker's, or the learner's registry) stopped with an error.
    #[error("the gRPC server failed: {0}")]
    Serve(#[source] tonic::transport::Error),
    /// A TLS certificate, key or CA file that cannot be used.
    #[error("TLS file {path}: {message}")]
    Tls {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// A worker could not be reached.
    #[error("cannot connect to the worker at {endpoint}: {source}")]
    Connect {
        /// The address as given.
        endpoint: String,
        /// Why.
        source: tonic::transport::Error,
    },
    /// The worker refused or failed a call.
    #[error("the worker answered {code:?}: {message}")]
    Rpc {
        /// The gRPC status code (`Unauthenticated` for a wrong token,
        /// `InvalidArgument` for a refused request or weight update).
        code: Code,
        /// The worker's message.
        message: String,
    },
    /// A call this client does not send, and why.
    #[error("not sent to the worker: {message}")]
    NotSent {
        /// Why.
        message: String,
    },
    /// The worker sent something this client cannot read.
    #[error("the worker sent a malformed {what}: {message}")]
    Protocol {
        /// Which message.
        what: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// A shared token that cannot be used.
    #[error("invalid worker token: {message}")]
    Token {
        /// What is wrong.
        message: String,
    },
    /// A chunk size that cannot carry a value or does not fit a gRPC message.
    #[error("chunk_bytes is {chunk_bytes}; it must be between {min} (one value) and {max}")]
    ChunkSize {
        /// The size asked for.
        chunk_bytes: usize,
        /// The smallest allowed: one value of the wire dtype.
        min: usize,
        /// The largest allowed ([`crate::MAX_CHUNK_BYTES`]).
        max: usize,
    },
}

impl WorkerError {
    /// Whether asking again cannot help: a wrong token, a refused request
    /// or weight update, a call the worker does not know, a malformed
    /// answer, a bad chunk size. Connection failures, timeouts and
    /// unavailable workers are worth retrying.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            WorkerError::Rpc {
                code: Code::Unauthenticated | Code::InvalidArgument | Code::Unimplemented,
                ..
            } | WorkerError::Protocol { .. }
                | WorkerError::ChunkSize { .. }
                | WorkerError::Token { .. }
        )
    }
}

impl From<Status> for WorkerError {
    fn from(status: Status) -> WorkerError {
        WorkerError::Rpc {
            code: status.code(),
            message: status.message().to_string(),
        }
    }
}

/// The status a worker answers for an engine error, keeping its message.
pub(crate) fn status(error: Error) -> Status {
    {
        let code = match &error {
            Error::InvalidRequest { .. } | Error::InvalidGuide { .. } | Error::InvalidUpdate { .. } => {
                Code::InvalidArgument
            }
            Error::Busy { .. } => Code::FailedPrecondition,
            Error::EngineStopped { .. } => Code::Unavailable,
            Error::Model(_) | Error::Xla(_) => Code::Internal,
        };
        Status::new(code, error.to_string())
    }
}
