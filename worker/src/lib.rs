//! grpo-worker: the rollout engine of grpo-rollout served over gRPC
//! (package `grpo.rollout.v1` of grpo-proto), and the client the learner
//! calls it with. The engine crate knows nothing of the transport.
//!
//! - [`WorkerServer`]: binds an address (loopback unless another is given),
//!   moves the engine onto its thread ([`grpo_rollout::handle`]) and serves
//!   Generate (one message per finished sample: token ids, log-probs,
//!   versions, finish reason), the three-phase weight update, Pause
//!   (abort / wait / keep), Resume, Health and Stats.
//! - [`WorkerClient`]: the same calls from the other side;
//!   [`WorkerClient::push_weights`] runs the three phases.
//! - [`weights`]: the weight-update wire format — f32 or bf16 slices with
//!   CRC-32 checksums — and the worker's assembly of it, which refuses any
//!   missing, overlapping or corrupt chunk and keeps the old weights.
//! - [`RegistryServer`] and [`announce`]: workers started with the
//!   learner's address register with it (and keep announcing themselves),
//!   so a fleet grows and heals without a fixed address list.
//! - [`AuthToken`]: the shared token every call carries
//!   (`authorization: Bearer <token>`), checked in constant time.
//! - [`ServerTls`] and [`ClientTls`]: optional TLS for both services (a
//!   server's certificate and key; the CA a caller trusts).
//! - [`WorkerServer::metrics_page`]: the worker's Prometheus page — the
//!   engine's gauges, weight updates (outcomes, bytes, time) and samples sent.
//! - [`WorkerError`]: what fails beyond the engine's errors; engine errors
//!   become gRPC status codes in one function (refused requests and
//!   updates `InvalidArgument`, a stopped engine `Unavailable`).

mod auth;
mod client;
mod convert;
mod error;
mod metrics;
mod registry;
mod server;
mod tls;
pub mod weights;

pub use auth::{AuthToken, TOKEN_VAR};
pub use client::{Health, PushOptions, RemoteSamples, WorkerClient};
pub use error::WorkerError;
/// The generated messages and services of `grpo.rollout.v1`.
pub use grpo_proto::rollout as proto;
pub use registry::{Registration, RegistryServer, announce};
pub use server::{DEFAULT_PORT, WorkerServer};
pub use tls::{ClientTls, ServerTls};
pub use weights::{EncodedUpdate, MAX_CHUNK_BYTES, WireDtype};

/// The version of the worker protocol this build speaks; a learner refuses
/// workers speaking another (they report it in Health and Register).
/// (2: weight updates may carry LoRA adapters.)
pub const PROTOCOL_VERSION: u32 = 2;
