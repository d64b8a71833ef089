//! grpo-proto: the gRPC protocol of grpo, generated from `proto/*.proto` by
//! tonic-prost-build at build time (protoc comes from the
//! protoc-bin-vendored crate).
//!
//! - [`rollout`]: package `grpo.rollout.v1`, the rollout worker service —
//!   generation, weight updates in three phases, pause / resume, health and
//!   stats. [`rollout::rollout_worker_server`] and
//!   [`rollout::rollout_worker_client`] are tonic's server and client;
//!   [`rollout::worker_registry_server`] and
//!   [`rollout::worker_registry_client`] are the learner's registry, where
//!   workers announce themselves.

#![warn(missing_docs)]

/// Package `grpo.rollout.v1` (see `proto/rollout.proto` for every message's documentation).
#[allow(missing_docs)]
pub mod rollout {
    tonic::include_proto!("grpo.rollout.v1");
}
