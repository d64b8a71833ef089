//! Workers that announce themselves: the learner's `WorkerRegistry`
//! service and the worker's side of it.
//!
//! - [`RegistryServer`] (the learner): takes `Register` calls behind the
//!   shared token, refuses another protocol version or an address it
//!   cannot dial, and hands each accepted [`Registration`] to the fleet on
//!   a channel. It keeps no state of its own: the fleet decides what a
//!   known address announcing again means.
//! - [`announce`] (the worker): registers with the learner, then again
//!   every `announce_every_ms` the learner asks for, so a learner that
//!   restarted learns of it again. An unreachable learner is retried; a
//!   refusal (token, protocol, address) ends it with the learner's reason.

use std::net::SocketAddr;
use std::time::Duration;

use grpo_proto::rollout as proto;
use grpo_proto::rollout::worker_registry_client::WorkerRegistryClient;
use grpo_proto::rollout::worker_registry_server::{WorkerRegistry, WorkerRegistryServer};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::service::interceptor::InterceptedService;
use tonic::{Code, Request, Response, Status};

use crate::PROTOCOL_VERSION;
use crate::auth::{AttachToken, AuthToken, CheckToken};
use crate::client::parse_endpoint;
use crate::error::WorkerError;
use crate::tls::{ClientTls, ServerTls, is_dialable, server_builder};

/// A worker that announced itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// Where the learner reaches its `RolloutWorker` service (`host:port`).
    pub address: String,
}

/// The learner's registry, bound to its address.
pub struct RegistryServer {
    listener: TcpListener,
    addr: SocketAddr,
    token: AuthToken,
    tls: Option<ServerTls>,
    service: Registry,
}

impl RegistryServer {
    /// Listens on `addr` (port 0 picks a free one) for workers carrying
    /// `token`, asking them to announce again every `announce_every`.
    /// Accepted registrations arrive on the returned channel.
    pub async fn bind(
        addr: SocketAddr,
        token: AuthToken,
        announce_every: Duration,
    ) -> Result<(RegistryServer, mpsc::UnboundedReceiver<Registration>), WorkerError> {
        let bind_error = |source| WorkerError::Bind { addr, source };
        let listener = TcpListener::bind(addr).await.map_err(bind_error)?;
        let addr = listener.local_addr().map_err(bind_error)?;
        let (sender, receiver) = mpsc::unbounded_channel();
        let service = Registry {
            sender,
            announce_every_ms: announce_every.as_millis().max(1) as u64,
        };
        let server = RegistryServer {
            listener,
            addr,
            token,
            tls: None,
            service,
        };
        Ok((server, receiver))
    }

    /// The address it listens on (with the port picked, if 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves over TLS with `tls` (only).
    pub fn with_tls(self, tls: ServerTls) -> RegistryServer {
        RegistryServer { tls: Some(tls), ..self }
    }

    /// Serves registrations until the server fails (or its task is dropped).
    pub async fn serve(self) -> Result<(), WorkerError> {
        let service = WorkerRegistryServer::new(self.service);
        server_builder(self.tls.as_ref())?
            .add_service(InterceptedService::new(service, CheckToken::new(&self.token)))
            .serve_with_incoming(TcpListenerStream::new(self.listener))
            .await
            .map_err(WorkerError::Serve)
    }
}

struct Registry {
    sender: mpsc::UnboundedSender<Registration>,
    announce_every_ms: u64,
}

#[tonic::async_trait]
impl WorkerRegistry for Registry {
    async fn register(
        &self,
        request: Request<proto::RegisterRequest>,
    ) -> Result<Response<proto::RegisterResponse>, Status> {
        let request = request.into_inner();
        if request.protocol_version != PROTOCOL_VERSION {
            return Err(Status::failed_precondition(format!(
                "the worker speaks protocol version {}, this learner speaks {PROTOCOL_VERSION}: \
                 run the same grpo release on both",
                request.protocol_version
            )));
        }
        if request.address.is_empty() || !is_dialable(&request.address) {
            return Err(Status::invalid_argument(format!(
                "`{}` is not an address the learner can dial; give the worker --advertise HOST:PORT",
                request.address
            )));
        }
        self.sender
            .send(Registration {
                address: request.address,
            })
            .map_err(|_| Status::unavailable("the learner is shutting down"))?;
        Ok(Response::new(proto::RegisterResponse {
            announce_every_ms: self.announce_every_ms,
        }))
    }
}

/// Bounds on how often a worker announces itself, whatever the learner asks.
const ANNOUNCE_EVERY: std::ops::RangeInclusive<Duration> = Duration::from_millis(100)..=Duration::from_secs(60);

/// How long a worker waits before trying an unreachable learner again.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// Registers the worker serving at `address` with the learner at `learner`
/// (over TLS as `tls` says) and keeps announcing it; returns only when the
/// learner refuses it. `on_change` hears each change between registered
/// and unreachable.
pub async fn announce(
    learner: &str,
    address: &str,
    token: &AuthToken,
    tls: &ClientTls,
    mut on_change: impl FnMut(Result<(), &WorkerError>),
) -> WorkerError {
    let channel = match parse_endpoint(learner, tls) {
        Ok(endpoint) => endpoint.connect_lazy(),
        Err(error) => return error,
    };
    let mut client = WorkerRegistryClient::with_interceptor(channel, AttachToken::new(token));
    let request = proto::RegisterRequest {
        protocol_version: PROTOCOL_VERSION,
        address: address.to_string(),
    };
    let mut registered = None;
    loop {
        let wait = match client.register(request.clone()).await {
            Ok(response) => {
                if registered != Some(true) {
                    on_change(Ok(()));
                }
                registered = Some(true);
                let every = Duration::from_millis(response.into_inner().announce_every_ms);
                every.clamp(*ANNOUNCE_EVERY.start(), *ANNOUNCE_EVERY.end())
            }
            Err(status)
                if matches!(
                    status.code(),
                    Code::Unauthenticated | Code::FailedPrecondition | Code::InvalidArgument
                ) =>
            {
                return status.into();
            }
            Err(status) => {
                if registered != Some(false) {
                    on_change(Err(&status.into()));
                }
                registered = Some(false);
                RETRY_AFTER
            }
        };
        tokio::time::sleep(wait).await;
    }
}
