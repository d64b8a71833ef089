//! What the routes generate with: a trait returning a stream of sample
//! updates per request, implemented over the rollout engine's
//! [`EngineHandle`]. Dropping a stream aborts its request and frees its slots.

use futures::future::BoxFuture;
use futures::stream::{self, BoxStream};
use grpo_model::lora::LoraConfig;
use grpo_model::weights::HostTensor;
use grpo_rollout::Result;
use grpo_rollout::adapters::AdapterId;
use grpo_rollout::engine::InFlight;
use grpo_rollout::handle::{EngineHandle, PauseMode, ServiceStats};
use grpo_rollout::output::SampleUpdate;
use grpo_rollout::request::Request;

/// One request's updates, in order; ends after its last sample finished.
pub type Updates = BoxStream<'static, Result<SampleUpdate>>;

/// A generation service the HTTP layer drives.
pub trait Backend: Send + Sync + 'static {
    /// Queues `request`; a request the engine cannot serve is refused here.
    fn generate(&self, request: Request) -> BoxFuture<'_, Result<Updates>>;
    /// The current load; an error once the engine is down.
    fn stats(&self) -> BoxFuture<'_, Result<ServiceStats>>;
    /// Whether the engine still runs, answered at once (for `/health`).
    fn is_running(&self) -> bool;
    /// Pauses generation (see [`PauseMode`]).
    fn pause(&self, mode: PauseMode) -> BoxFuture<'_, Result<()>>;
    /// Resumes generation.
    fn resume(&self) -> BoxFuture<'_, Result<()>>;
    /// Installs new weights as `version`.
    fn update_weights(
        &self,
        version: u64,
        tensors: Vec<(String, HostTensor)>,
        in_flight: InFlight,
    ) -> BoxFuture<'_, Result<()>>;
    /// Loads a LoRA adapter for requests to pick by the returned id.
    fn load_adapter(&self, lora: LoraConfig, tensors: Vec<(String, HostTensor)>) -> BoxFuture<'_, Result<AdapterId>>;
    /// Unloads an adapter (its requests end as aborted); false if it is not loaded.
    fn unload_adapter(&self, id: AdapterId) -> BoxFuture<'_, Result<bool>>;
}

impl Backend for EngineHandle {
    fn generate(&self, request: Request) -> BoxFuture<'_, Result<Updates>> {
        Box::pin(async move {
            let samples = EngineHandle::generate(self, request).await?;
            let updates = stream::unfold(samples, |mut samples| async move {
                let update = samples.next().await?;
                Some((update, samples))
            });
            Ok(Box::pin(updates) as Updates)
        })
    }

    fn stats(&self) -> BoxFuture<'_, Result<ServiceStats>> {
        Box::pin(EngineHandle::stats(self))
    }

    fn is_running(&self) -> bool {
        EngineHandle::is_running(self)
    }

    fn pause(&self, mode: PauseMode) -> BoxFuture<'_, Result<()>> {
        Box::pin(EngineHandle::pause(self, mode))
    }

    fn resume(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(EngineHandle::resume(self))
    }

    fn update_weights(
        &self,
        version: u64,
        tensors: Vec<(String, HostTensor)>,
        in_flight: InFlight,
    ) -> BoxFuture<'_, Result<()>> {
        Box::pin(EngineHandle::update_weights(self, version, tensors, in_flight))
    }

    fn load_adapter(&self, lora: LoraConfig, tensors: Vec<(String, HostTensor)>) -> BoxFuture<'_, Result<AdapterId>> {
        Box::pin(EngineHandle::load_adapter(self, lora, tensors))
    }

    fn unload_adapter(&self, id: AdapterId) -> BoxFuture<'_, Result<bool>> {
        Box::pin(EngineHandle::unload_adapter(self, id))
    }
}
