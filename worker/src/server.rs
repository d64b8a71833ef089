//! The worker's gRPC server: the `RolloutWorker` service on an
//! [`EngineHandle`], behind the token check.
//!
//! Generate forwards each finished sample of the request's stream and
//! aborts the request when the caller goes away. A weight update is staged
//! here between its start and its finish ([`StagedUpdate`]): one at a time,
//! a new start replacing an unfinished one; the first bad chunk rejects it
//! (the reason is kept for later chunks and the finish), and only a
//! complete, intact update reaches the engine, which checks it once more
//! before swapping it in between two steps.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use grpo_model::decoder::Decoder;
use grpo_proto::rollout as proto;
use grpo_proto::rollout::rollout_worker_server::{RolloutWorker, RolloutWorkerServer};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::server::NamedService;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status, Streaming};
use tonic_health::ServingStatus;

use crate::PROTOCOL_VERSION;
use crate::auth::{AuthToken, CheckToken};
use crate::convert::{pause_mode_from_proto, request_from_proto, sample_to_proto, stats_to_proto};
use crate::error::{WorkerError, status};
use crate::metrics::{WorkerMetrics, page};
use crate::tls::{ServerTls, server_builder};
use crate::weights::{MAX_CHUNK_BYTES, StagedUpdate, announced_parameters};
use grpo_rollout::engine::Engine;
use grpo_rollout::handle::{EngineHandle, SampleStream};
use grpo_xla::ElementType;

/// The port a worker listens on unless told otherwise.
pub const DEFAULT_PORT: u16 = 50051;

/// HTTP/2 receive windows of a worker's connections: the default 64 KiB
/// stream window makes a weight push wait for a window update every 64 KiB.
pub(crate) const STREAM_WINDOW: u32 = 8 << 20;
/// See [`STREAM_WINDOW`].
pub(crate) const CONNECTION_WINDOW: u32 = 32 << 20;

/// Room in a chunk message for everything but its values.
const MESSAGE_OVERHEAD: usize = 64 << 10;

/// Finished samples buffered per Generate call before the engine's stream
/// waits for the caller.
const SAMPLES_BUFFERED: usize = 16;

/// A worker bound to its address, ready to serve.
pub struct WorkerServer {
    listener: TcpListener,
    addr: SocketAddr,
    service: Service,
    token: AuthToken,
    tls: Option<ServerTls>,
}

impl WorkerServer {
    /// Listens on `addr` (give `127.0.0.1` to stay on this machine; port 0
    /// picks a free one) and moves `engine` onto its own thread. Calls must
    /// carry `token`.
    pub async fn bind(addr: SocketAddr, engine: Engine, token: AuthToken) -> Result<WorkerServer, WorkerError> {
        let bind_error = |source| WorkerError::Bind { addr, source };
        let listener = TcpListener::bind(addr).await.map_err(bind_error)?;
        let addr = listener.local_addr().map_err(bind_error)?;
        let service = Service {
            instance: std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), addr),
            decoder: engine.decoder().base(),
            engine_dtype: engine.config().dtype,
            handle: EngineHandle::spawn(engine),
            staging: Mutex::new(Staging::Idle),
            metrics: Arc::new(WorkerMetrics::new()),
        };
        Ok(WorkerServer {
            listener,
            addr,
            service,
            token,
            tls: None,
        })
    }

    /// Serves over TLS with `tls` (only), the health service too.
    pub fn with_tls(self, tls: ServerTls) -> WorkerServer {
        WorkerServer { tls: Some(tls), ..self }
    }

    /// Whether it serves over TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The address it listens on (with the port picked, if 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its Prometheus page: the engine's gauges read at each scrape, and
    /// the worker's counters ([`crate::metrics`]).
    pub fn metrics_page(&self) -> grpo_metrics::endpoint::Page {
        page(self.service.metrics.clone(), self.service.handle.clone())
    }

    /// Serves calls until the server fails (or its task is dropped).
    pub async fn serve(self) -> Result<(), WorkerError> {
        self.serve_until(std::future::pending()).await
    }

    /// Serves calls until `shutdown` resolves, then drains: takes no new
    /// call (connections are told to go away, so a learner sends its next
    /// groups elsewhere) and returns once the calls in flight have finished.
    ///
    /// Beside the worker's service it serves the standard gRPC health
    /// service (`grpc.health.v1.Health`, no token needed, for probes such
    /// as Kubernetes'): SERVING for the whole server (`""`) and for
    /// `grpo.rollout.v1.RolloutWorker` — the model's weights are on the
    /// device before the server listens — and NOT_SERVING once it drains.
    pub async fn serve_until(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), WorkerError> {
        let service =
            RolloutWorkerServer::new(self.service).max_decoding_message_size(MAX_CHUNK_BYTES + MESSAGE_OVERHEAD);
        let (reporter, health) = tonic_health::server::health_reporter();
        let names = ["", <RolloutWorkerServer<Service> as NamedService>::NAME];
        for name in names {
            reporter.set_service_status(name, ServingStatus::Serving).await;
        }
        let draining = async move {
            shutdown.await;
            for name in names {
                reporter.set_service_status(name, ServingStatus::NotServing).await;
            }
        };
        server_builder(self.tls.as_ref())?
            .initial_stream_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .add_service(health)
            .add_service(InterceptedService::new(service, CheckToken::new(&self.token)))
            .serve_with_incoming_shutdown(TcpListenerStream::new(self.listener), draining)
            .await
            .map_err(WorkerError::Serve)
    }
}

/// Where the weight update in progress stands.
enum Staging {
    /// None started (or the last one finished).
    Idle,
    /// Started at the instant given, taking chunks.
    Open(StagedUpdate, Instant),
    /// Refused, with the reason, until the next start.
    Rejected { version: u64, reason: String },
}

impl Staging {
    /// Why there is no open update to use.
    fn not_open(&self) -> Status {
        match self {
            Staging::Rejected { version, reason } => {
                Status::failed_precondition(format!("the weight update to version {version} was rejected: {reason}"))
            }
            _ => Status::failed_precondition("no weight update is staged: call StartWeightUpdate first"),
        }
    }
}

/// The service's state: the engine and the staged weight update.
struct Service {
    /// Drawn at start (a random hash): tells a restarted worker from the one before.
    instance: u64,
    handle: EngineHandle,
    /// The model without adapters, whose parameters (or adapters of an
    /// announced layout) announced tensors must be.
    decoder: Decoder,
    /// The engine's weight dtype, which staged updates are held in.
    engine_dtype: ElementType,
    staging: Mutex<Staging>,
    metrics: Arc<WorkerMetrics>,
}

impl Service {
    fn staging(&self) -> MutexGuard<'_, Staging> {
        self.staging.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a chunk to the open update; a bad chunk rejects the update.
    fn add_chunk(&self, chunk: &proto::WeightChunk) -> Result<usize, Status> {
        let mut staging = self.staging();
        let Staging::Open(update, _) = &mut *staging else {
            return Err(staging.not_open());
        };
        self.metrics.update_bytes.inc_by(chunk.data.len() as u64);
        let version = update.version();
        let added = update.add(chunk);
        if let Err(error) = &added {
            *staging = Staging::Rejected {
                version,
                reason: error.to_string(),
            };
            self.metrics.update_finished(false);
        }
        added.map_err(status)
    }
}

/// Sends each finished sample to the caller until all have finished;
/// stops when the caller goes away (dropping `samples` aborts the request).
async fn forward(
    mut samples: SampleStream,
    sender: mpsc::Sender<Result<proto::Sample, Status>>,
    metrics: Arc<WorkerMetrics>,
) {
    loop {
        let update = tokio::select! {
            update = samples.next() => update,
            () = sender.closed() => return,
        };
        let (message, last) = match update {
            None => return,
            Some(Ok(update)) => match update.finished {
                Some(completion) => {
                    metrics.samples_sent.inc();
                    (Ok(sample_to_proto(samples.id, completion)), false)
                }
                None => continue,
            },
            // The engine stopped: the call ends with its status.
            Some(Err(error)) => (Err(status(error)), true),
        };
        if sender.send(message).await.is_err() || last {
            return;
        }
    }
}

#[tonic::async_trait]
impl RolloutWorker for Service {
    type GenerateStream = ReceiverStream<Result<proto::Sample, Status>>;

    async fn generate(
        &self,
        request: Request<proto::GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        let samples = self
            .handle
            .generate(request_from_proto(request.into_inner())?)
            .await
            .map_err(status)?;
        self.metrics.generate_calls.inc();
        let (sender, receiver) = mpsc::channel(SAMPLES_BUFFERED);
        tokio::spawn(forward(samples, sender, self.metrics.clone()));
        Ok(Response::new(ReceiverStream::new(receiver)))
    }

    async fn start_weight_update(
        &self,
        request: Request<proto::StartWeightUpdateRequest>,
    ) -> Result<Response<proto::StartWeightUpdateResponse>, Status> {
        let start = request.into_inner();
        let staged = announced_parameters(&start, &self.decoder)
            .and_then(|(adapters, parameters)| StagedUpdate::new(&start, &parameters, adapters, self.engine_dtype));
        let mut staging = self.staging();
        match staged {
            Ok(update) => {
                *staging = Staging::Open(update, Instant::now());
                Ok(Response::new(proto::StartWeightUpdateResponse {}))
            }
            Err(error) => {
                *staging = Staging::Rejected {
                    version: start.version,
                    reason: error.to_string(),
                };
                self.metrics.update_finished(false);
                Err(status(error))
            }
        }
    }

    async fn send_weight_chunks(
        &self,
        request: Request<Streaming<proto::WeightChunk>>,
    ) -> Result<Response<proto::SendWeightChunksResponse>, Status> {
        let mut stream = request.into_inner();
        let mut done = proto::SendWeightChunksResponse { chunks: 0, elements: 0 };
        while let Some(chunk) = stream.message().await? {
            done.elements += self.add_chunk(&chunk)? as u64;
            done.chunks += 1;
        }
        Ok(Response::new(done))
    }

    async fn finish_weight_update(
        &self,
        request: Request<proto::FinishWeightUpdateRequest>,
    ) -> Result<Response<proto::FinishWeightUpdateResponse>, Status> {
        let version = request.into_inner().version;
        let taken = std::mem::replace(&mut *self.staging(), Staging::Idle);
        let (update, started) = match taken {
            Staging::Open(update, started) => (update, started),
            other => {
                let status = other.not_open();
                *self.staging() = other;
                return Err(status);
            }
        };
        let staged = update.version();
        let installed = match update.finish(version) {
            Ok(done) => match done.adapters {
                Some(lora) => {
                    let handle = &self.handle;
                    handle
                        .update_adapters(done.version, lora, done.tensors, done.in_flight)
                        .await
                }
                None => {
                    self.handle
                        .update_weights(done.version, done.tensors, done.in_flight)
                        .await
                }
            },
            Err(error) => Err(error),
        };
        self.metrics.update_finished(installed.is_ok());
        if let Err(error) = installed {
            let reason = error.to_string();
            let mut staging = self.staging();
            // A start that came in meanwhile stays staged.
            if matches!(*staging, Staging::Idle) {
                *staging = Staging::Rejected {
                    version: staged,
                    reason,
                };
            }
            return Err(status(error));
        }
        self.metrics.update_seconds.observe(started.elapsed().as_secs_f64());
        Ok(Response::new(proto::FinishWeightUpdateResponse { version }))
    }

    async fn pause(&self, request: Request<proto::PauseRequest>) -> Result<Response<proto::PauseResponse>, Status> {
        let code = request.into_inner().mode;
        let mode = pause_mode_from_proto(code)
            .ok_or_else(|| Status::invalid_argument(format!("pause mode {code} is not ABORT, WAIT or KEEP")))?;
        self.handle.pause(mode).await.map_err(status)?;
        Ok(Response::new(proto::PauseResponse {}))
    }

    async fn resume(&self, _: Request<proto::ResumeRequest>) -> Result<Response<proto::ResumeResponse>, Status> {
        self.handle.resume().await.map_err(status)?;
        Ok(Response::new(proto::ResumeResponse {}))
    }

    async fn health(&self, _: Request<proto::HealthRequest>) -> Result<Response<proto::HealthResponse>, Status> {
        let stats = self.handle.stats().await.map_err(status)?;
        let status = if stats.paused {
            proto::ServingStatus::Paused
        } else {
            proto::ServingStatus::Serving
        };
        Ok(Response::new(proto::HealthResponse {
            status: status.into(),
            version: stats.engine.version,
            protocol_version: PROTOCOL_VERSION,
            max_num_seqs: stats.engine.slots() as u64,
            instance: self.instance,
        }))
    }

    async fn stats(&self, _: Request<proto::StatsRequest>) -> Result<Response<proto::StatsResponse>, Status> {
        Ok(Response::new(stats_to_proto(
            &self.handle.stats().await.map_err(status)?,
        )))
    }
}
