//! A caller of a rollout worker (the learner's side): generation as a
//! stream of finished samples, weight pushes in the three phases, pause,
//! resume, health and stats. Every call carries the shared token.

use grpo_model::lora::LoraConfig;
use grpo_model::weights::HostTensor;
use grpo_proto::rollout as proto;
use grpo_proto::rollout::rollout_worker_client::RolloutWorkerClient;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::auth::{AttachToken, AuthToken};
use crate::convert::{pause_mode_to_proto, request_to_proto, sample_from_proto, stats_from_proto};
use crate::error::WorkerError;
use crate::server::{CONNECTION_WINDOW, STREAM_WINDOW};
use crate::tls::ClientTls;
use crate::weights::{EncodedUpdate, MAX_CHUNK_BYTES, WireDtype};
use grpo_rollout::engine::InFlight;
use grpo_rollout::handle::{PauseMode, ServiceStats};
use grpo_rollout::output::Completion;
use grpo_rollout::request::Request;

/// Chunks queued ahead of the network while pushing weights.
const CHUNKS_AHEAD: usize = 4;

/// How [`WorkerClient::push_weights`] sends tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PushOptions {
    /// How values travel. Default f32 (exact); bf16 halves the bytes.
    pub dtype: WireDtype,
    /// Bytes of values per chunk, at most [`MAX_CHUNK_BYTES`]. Default 1 MiB.
    pub chunk_bytes: usize,
    /// What the worker's running samples do on the new weights. Default keep.
    pub in_flight: InFlight,
}

impl PushOptions {
    /// `tensors` (adapters of layout `adapters`, or model parameters)
    /// encoded as `version` the way these options send them (once, for as
    /// many workers as take them), after checking the chunk size.
    pub fn encode(
        &self,
        version: u64,
        tensors: &[(String, HostTensor)],
        adapters: Option<&LoraConfig>,
    ) -> Result<EncodedUpdate, WorkerError> {
        let min = self.dtype.element_bytes();
        if !(min..=MAX_CHUNK_BYTES).contains(&self.chunk_bytes) {
            return Err(WorkerError::ChunkSize {
                chunk_bytes: self.chunk_bytes,
                min,
                max: MAX_CHUNK_BYTES,
            });
        }
        Ok(EncodedUpdate::new(
            version,
            (tensors, adapters),
            self.dtype,
            self.chunk_bytes,
            self.in_flight,
        ))
    }
}

impl Default for PushOptions {
    fn default() -> Self {
        PushOptions {
            dtype: WireDtype::F32,
            chunk_bytes: 1 << 20,
            in_flight: InFlight::Keep,
        }
    }
}

/// A worker's answer to Health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Health {
    /// Whether generation is paused.
    pub paused: bool,
    /// The policy version serving.
    pub version: u64,
    /// The protocol version it speaks ([`crate::PROTOCOL_VERSION`]
    /// for this build; 0 from workers older than the field).
    pub protocol_version: u32,
    /// Samples it decodes together (its engine slots).
    pub max_num_seqs: usize,
    /// Drawn when the worker started: another one means a restarted worker.
    pub instance: u64,
}

/// `endpoint` (`host:port` or a URL) as a tonic endpoint, over TLS as
/// `tls` says ([`ClientTls`]).
pub(crate) fn parse_endpoint(endpoint: &str, tls: &ClientTls) -> Result<Endpoint, WorkerError> {
    Ok(tls
        .endpoint(endpoint)?
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW))
}

/// The finished samples of one Generate call, in the order they finish.
/// Dropping it cancels the call, which aborts the request on the worker.
pub struct RemoteSamples {
    stream: tonic::Streaming<proto::Sample>,
}

impl RemoteSamples {
    /// The next finished sample; `None` once all have arrived.
    pub async fn next(&mut self) -> Result<Option<Completion>, WorkerError> {
        match self.stream.message().await? {
            Some(sample) => Ok(Some(sample_from_proto(sample)?)),
            None => Ok(None),
        }
    }

    /// Every sample, by index.
    pub async fn all(mut self) -> Result<Vec<Completion>, WorkerError> {
        let mut samples = Vec::new();
        while let Some(sample) = self.next().await? {
            samples.push(sample);
        }
        samples.sort_by_key(|s| s.index);
        Ok(samples)
    }
}

/// A connection to one worker; cheap to clone (clones share it).
#[derive(Debug, Clone)]
pub struct WorkerClient {
    inner: RolloutWorkerClient<InterceptedService<Channel, AttachToken>>,
}

impl WorkerClient {
    /// Connects to the worker at `endpoint` (`host:port`, or a URL such as
    /// `https://host:port`), over TLS as `tls` says, sending `token` with
    /// every call.
    pub async fn connect(endpoint: &str, token: &AuthToken, tls: &ClientTls) -> Result<WorkerClient, WorkerError> {
        let channel = parse_endpoint(endpoint, tls)?
            .connect()
            .await
            .map_err(|source| WorkerError::Connect {
                endpoint: endpoint.to_string(),
                source,
            })?;
        Ok(WorkerClient::on(channel, token))
    }

    /// A client of the worker at `endpoint` that connects on its first call
    /// (and reconnects after the worker restarts), for workers that may not
    /// be up yet. Call it within a tokio runtime.
    pub fn connect_lazy(endpoint: &str, token: &AuthToken, tls: &ClientTls) -> Result<WorkerClient, WorkerError> {
        Ok(WorkerClient::on(parse_endpoint(endpoint, tls)?.connect_lazy(), token))
    }

    fn on(channel: Channel, token: &AuthToken) -> WorkerClient {
        WorkerClient {
            inner: RolloutWorkerClient::with_interceptor(channel, AttachToken::new(token)),
        }
    }

    /// Starts generating `request`'s samples. A request naming an adapter
    /// is refused: adapter ids belong to one engine, and workers serve the
    /// policy alone.
    pub async fn generate(&mut self, request: &Request) -> Result<RemoteSamples, WorkerError> {
        if let Some(id) = request.params.adapter {
            return Err(WorkerError::NotSent {
                message: format!("workers serve no named adapters; the request names adapter {}", id.0),
            });
        }
        let stream = self.inner.generate(request_to_proto(request)).await?.into_inner();
        Ok(RemoteSamples { stream })
    }

    /// Installs `tensors` (Hugging Face names, any subset of the model's
    /// parameters) as policy `version`: encodes them
    /// ([`PushOptions::encode`], one encoded copy while pushing), then
    /// [`WorkerClient::push_encoded`].
    pub async fn push_weights(
        &mut self,
        version: u64,
        tensors: &[(String, HostTensor)],
        options: &PushOptions,
    ) -> Result<(), WorkerError> {
        self.push_encoded(&options.encode(version, tensors, None)?).await
    }

    /// Installs an encoded update: announces its tensors, streams their
    /// chunks, and finishes. A refusal at any phase leaves the worker on
    /// its old weights.
    pub async fn push_encoded(&mut self, update: &EncodedUpdate) -> Result<(), WorkerError> {
        self.start_weight_update(update.start.clone()).await?;
        self.send_weight_chunks(update.chunks.iter().cloned()).await?;
        self.finish_weight_update(update.version()).await
    }

    /// Phase 1 of a weight update (see [`EncodedUpdate::start`]).
    pub async fn start_weight_update(&mut self, start: proto::StartWeightUpdateRequest) -> Result<(), WorkerError> {
        self.inner.start_weight_update(start).await?;
        Ok(())
    }

    /// Phase 2: streams `chunks` (see [`EncodedUpdate::chunks`]), a few
    /// ahead of the network; stops early when the worker refuses one.
    pub async fn send_weight_chunks(
        &mut self,
        chunks: impl Iterator<Item = proto::WeightChunk>,
    ) -> Result<proto::SendWeightChunksResponse, WorkerError> {
        let (sender, receiver) = mpsc::channel(CHUNKS_AHEAD);
        let call = self.inner.send_weight_chunks(ReceiverStream::new(receiver));
        let produce = async move {
            for chunk in chunks {
                if sender.send(chunk).await.is_err() {
                    break;
                }
            }
        };
        tokio::pin!(call);
        let response = tokio::select! {
            response = &mut call => response,
            () = produce => call.await,
        };
        Ok(response?.into_inner())
    }

    /// Phase 3: installs the staged update `version`.
    pub async fn finish_weight_update(&mut self, version: u64) -> Result<(), WorkerError> {
        self.inner
            .finish_weight_update(proto::FinishWeightUpdateRequest { version })
            .await?;
        Ok(())
    }

    /// Pauses generation; returns once paused (for [`PauseMode::Wait`], once
    /// the requests the worker held have finished).
    pub async fn pause(&mut self, mode: PauseMode) -> Result<(), WorkerError> {
        let mode = pause_mode_to_proto(mode).into();
        self.inner.pause(proto::PauseRequest { mode }).await?;
        Ok(())
    }

    /// Resumes generation.
    pub async fn resume(&mut self) -> Result<(), WorkerError> {
        self.inner.resume(proto::ResumeRequest {}).await?;
        Ok(())
    }

    /// Whether the worker is paused, and its policy version.
    pub async fn health(&mut self) -> Result<Health, WorkerError> {
        let health = self.inner.health(proto::HealthRequest {}).await?.into_inner();
        let paused = match proto::ServingStatus::try_from(health.status) {
            Ok(proto::ServingStatus::Serving) => false,
            Ok(proto::ServingStatus::Paused) => true,
            _ => {
                return Err(WorkerError::Protocol {
                    what: "health",
                    message: format!("serving status {}", health.status),
                });
            }
        };
        Ok(Health {
            paused,
            version: health.version,
            protocol_version: health.protocol_version,
            max_num_seqs: health.max_num_seqs as usize,
            instance: health.instance,
        })
    }

    /// The worker's load.
    pub async fn stats(&mut self) -> Result<ServiceStats, WorkerError> {
        let stats = self.inner.stats(proto::StatsRequest {}).await?.into_inner();
        Ok(stats_from_proto(stats))
    }
}
