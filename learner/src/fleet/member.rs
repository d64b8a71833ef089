//! One member of a [`super::WorkerFleet`]: a rollout worker over gRPC or
//! the in-process engine's async handle, what the fleet knows of it, and
//! the three things the fleet asks of it (generate a group, take weights,
//! say how it is), each a future the fleet runs as a task of its own.

use std::sync::Arc;
use std::time::{Duration, Instant};

use grpo_model::lora::LoraConfig;
use grpo_rollout::engine::InFlight;
use grpo_rollout::handle::EngineHandle;
use grpo_rollout::output::Completion;
use grpo_rollout::request::Request;
use grpo_worker::{EncodedUpdate, Health, PROTOCOL_VERSION, PushOptions, WorkerClient, WorkerError};
use tokio::sync::OnceCell;
use tokio::task::AbortHandle;

use super::HostWeights;

/// How the fleet reaches a member.
#[derive(Clone)]
pub(super) enum Connection {
    /// A `grpo worker` over gRPC.
    Remote(WorkerClient),
    /// The in-process engine on its own thread; weights handed over in memory.
    Local(EngineHandle),
}

/// What the fleet knows of a member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum State {
    /// Not heard from yet: just listed or registered.
    Unknown,
    /// Answers, but serves another policy version than the fleet's: it gets
    /// the current weights before any work.
    Behind,
    /// Answers and serves the fleet's version: it takes work.
    Ready,
    /// Failed a call or missed a Health deadline; asked again every
    /// heartbeat, and Behind once it answers.
    Down(String),
    /// Refused (another protocol, weights that do not fit its model, a
    /// wrong token): not asked again unless it registers anew.
    Refused(String),
}

/// Why a call to a member failed, and whether asking again can help.
#[derive(Debug, Clone)]
pub struct Failure {
    /// What went wrong.
    pub message: String,
    /// A refusal that repeats whatever is retried (token, protocol, a
    /// model the weights do not fit).
    pub permanent: bool,
}

impl From<WorkerError> for Failure {
    fn from(error: WorkerError) -> Failure {
        Failure {
            permanent: error.is_refusal(),
            message: error.to_string(),
        }
    }
}

impl From<grpo_rollout::Error> for Failure {
    fn from(error: grpo_rollout::Error) -> Failure {
        // The in-process engine does not come back from a failure.
        Failure {
            message: error.to_string(),
            permanent: true,
        }
    }
}

/// The instance the in-process engine reports: it cannot restart.
pub(super) const LOCAL_INSTANCE: u64 = 0;

/// A member and its bookkeeping.
pub(super) struct Member {
    /// Its address, or `in-process`.
    pub name: String,
    pub connection: Connection,
    pub state: State,
    /// Samples it decodes together (from its last Health answer).
    pub slots: usize,
    /// Samples given to it and not yet returned.
    pub assigned: usize,
    /// The process it was, by the instance of its last Health answer.
    pub instance: Option<u64>,
    /// The version this fleet last installed on that process (a member is
    /// ready only on weights the fleet gave it, never on its start-up ones).
    pub installed: Option<u64>,
    /// When it is next asked for its health.
    pub next_ping: Instant,
    /// The Health call in flight: its ticket and task.
    pub ping: Option<(u64, AbortHandle)>,
    /// The weight push in flight: its ticket and task.
    pub push: Option<(u64, AbortHandle)>,
    /// The last refusal logged (a refused worker that keeps announcing
    /// itself is refused again each time; it is said once).
    pub refused_for: Option<String>,
}

impl Member {
    /// A member not heard from yet, asked for its health at once.
    pub fn new(name: String, connection: Connection) -> Member {
        Member {
            name,
            connection,
            state: State::Unknown,
            slots: 1,
            assigned: 0,
            instance: None,
            installed: None,
            next_ping: Instant::now(),
            ping: None,
            push: None,
            refused_for: None,
        }
    }

    /// Whether it takes work now.
    pub fn ready(&self) -> bool {
        self.state == State::Ready
    }

    /// How full it would be with `samples` more, as a fraction of its slots.
    pub fn load_with(&self, samples: usize) -> f64 {
        (self.assigned + samples) as f64 / self.slots.max(1) as f64
    }
}

/// The samples of `request`, all of them or the failure; a worker's are
/// checked ([`check_answer`]) against a vocabulary of `vocab_size` tokens.
pub(super) async fn generate(
    connection: Connection,
    request: Request,
    vocab_size: usize,
) -> Result<Vec<Completion>, Failure> {
    match connection {
        Connection::Remote(mut client) => {
            let samples = client.generate(&request).await?.all().await?;
            check_answer(&request, &samples, vocab_size)?;
            Ok(samples)
        }
        Connection::Local(handle) => Ok(handle.generate(request).await?.finished().await?),
    }
}

/// Refuses a worker's answer to `request` unless it is the request's `n`
/// samples, each once, of at most `max_tokens` ids below `vocab_size`, each
/// token with a finite log-prob of at most 0 and the policy version it was
/// sampled under: a bad answer is the worker's fault (its group goes to
/// another member), never training data.
pub fn check_answer(request: &Request, samples: &[Completion], vocab_size: usize) -> Result<(), Failure> {
    let bad = |what: String| Failure {
        message: format!("answered {what}"),
        permanent: false,
    };
    let n = request.params.n;
    if samples.len() != n {
        return Err(bad(format!("{} samples for n = {n}", samples.len())));
    }
    let mut seen = vec![false; n];
    for sample in samples {
        if sample.index >= n || std::mem::replace(&mut seen[sample.index], true) {
            return Err(bad(format!("sample index {} twice or beyond n = {n}", sample.index)));
        }
        let tokens = sample.tokens.len();
        if tokens > request.params.max_tokens {
            return Err(bad(format!(
                "{tokens} tokens for max_tokens = {}",
                request.params.max_tokens
            )));
        }
        if sample.logprobs.len() != tokens || sample.versions.len() != tokens {
            return Err(bad(format!(
                "{tokens} tokens with {} log-probs and {} versions",
                sample.logprobs.len(),
                sample.versions.len()
            )));
        }
        if let Some(id) = sample.tokens.iter().find(|&&id| id as usize >= vocab_size) {
            return Err(bad(format!("token id {id} outside the vocabulary of {vocab_size}")));
        }
        if let Some(logprob) = sample.logprobs.iter().find(|lp| !(lp.is_finite() && **lp <= 0.0)) {
            return Err(bad(format!("log-prob {logprob} (not a finite number at most 0)")));
        }
    }
    Ok(())
}

/// The fleet's current weights as pushes take them: the tensors (for the
/// in-process engine and for encoding), and their encoding for the wire,
/// made by the first worker push of the version and shared by the others
/// (one encoded copy, one pass).
#[derive(Clone)]
pub(super) struct Payload {
    /// The named f32 tensors.
    pub tensors: HostWeights,
    /// The layout the tensors are adapters of (`None`: model parameters).
    adapters: Option<LoraConfig>,
    encoded: Arc<OnceCell<Arc<EncodedUpdate>>>,
}

impl Payload {
    /// `tensors`, not yet encoded.
    pub fn new(tensors: HostWeights) -> Payload {
        Payload {
            tensors,
            adapters: None,
            encoded: Arc::default(),
        }
    }

    /// Adapter `tensors` of layout `lora`.
    pub fn adapters(lora: LoraConfig, tensors: HostWeights) -> Payload {
        Payload {
            adapters: Some(lora),
            ..Payload::new(tensors)
        }
    }

    /// The tensors encoded as `version` by `options`: made off the async
    /// threads by the first caller, shared with the others.
    async fn encoded(&self, version: u64, options: PushOptions) -> Result<&EncodedUpdate, Failure> {
        let tensors = self.tensors.clone();
        let adapters = self.adapters.clone();
        let update = self
            .encoded
            .get_or_try_init(|| async move {
                let encode = move || options.encode(version, &tensors, adapters.as_ref()).map(Arc::new);
                tokio::task::spawn_blocking(encode)
                    .await
                    .map_err(|e| Failure {
                        message: format!("encoding the weights failed: {e}"),
                        permanent: false,
                    })?
                    .map_err(Failure::from)
            })
            .await?;
        Ok(update)
    }
}

/// Installs `payload` as `version` on the member: the tensors in memory
/// for the in-process engine, their encoding for a worker.
pub(super) async fn push(
    connection: Connection,
    version: u64,
    payload: Payload,
    options: PushOptions,
) -> Result<(), Failure> {
    match (connection, payload.adapters.clone()) {
        (Connection::Remote(mut client), _) => {
            Ok(client.push_encoded(payload.encoded(version, options).await?).await?)
        }
        (Connection::Local(handle), Some(lora)) => Ok(handle
            .update_adapters(version, lora, payload.tensors, InFlight::Keep)
            .await?),
        (Connection::Local(handle), None) => {
            Ok(handle.update_weights(version, payload.tensors, InFlight::Keep).await?)
        }
    }
}

/// The member's health, or a failure when it does not answer within
/// `deadline` or speaks another protocol.
pub(super) async fn ping(connection: Connection, deadline: Duration) -> Result<Health, Failure> {
    let health = async {
        match connection {
            Connection::Remote(mut client) => Ok::<_, Failure>(client.health().await?),
            Connection::Local(handle) => {
                let stats = handle.stats().await?;
                Ok(Health {
                    paused: stats.paused,
                    version: stats.engine.version,
                    protocol_version: PROTOCOL_VERSION,
                    max_num_seqs: stats.engine.slots(),
                    instance: LOCAL_INSTANCE,
                })
            }
        }
    };
    let health = tokio::time::timeout(deadline, health).await.map_err(|_| Failure {
        message: format!("no answer to Health within {:.1} s", deadline.as_secs_f64()),
        permanent: false,
    })??;
    if health.protocol_version != PROTOCOL_VERSION {
        return Err(Failure {
            message: format!(
                "it speaks worker protocol version {}, this learner speaks {PROTOCOL_VERSION}: \
                 run the same grpo release on both",
                health.protocol_version
            ),
            permanent: true,
        });
    }
    Ok(health)
}
