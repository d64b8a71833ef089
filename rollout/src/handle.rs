//! The engine as an async service: an actor thread owns the [`Engine`] and
//! takes commands over a channel, each answered on its own oneshot; every
//! request gets a stream of its samples' updates.
//!
//! The thread steps the engine while it has work and is not paused, and
//! handles all queued commands between steps (so aborts, weight updates
//! and new requests land between decode steps). With nothing to do it
//! sleeps on the command channel. Pausing:
//! - [`PauseMode::Abort`] aborts every waiting and running request (and
//!   those held back by an earlier pause);
//! - [`PauseMode::Wait`] lets the requests the engine holds finish
//!   (answering once they have);
//! - [`PauseMode::Keep`] freezes them where they are until resumed.
//!
//! While paused, new requests are held by the actor (their `generate`
//! calls return on [`EngineHandle::resume`], when they join the engine). Dropping a [`SampleStream`] aborts its request.
//! A device failure stops the thread: open streams get the error, later
//! calls [`Error::EngineStopped`].

use std::collections::{HashMap, VecDeque};
use std::thread;

use grpo_model::lora::LoraConfig;
use grpo_model::weights::HostTensor;
use tokio::sync::{mpsc, oneshot};

use crate::adapters::AdapterId;
use crate::engine::{Engine, EngineStats, InFlight};
use crate::error::{Error, Result};
use crate::host_weights::{IncomingWeights, ParameterValues};
use crate::output::{Completion, RequestId, SampleUpdate};
use crate::request::Request;

/// How [`EngineHandle::pause`] treats the requests the engine holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseMode {
    /// Abort them.
    Abort,
    /// Let them finish; the call returns when they have.
    Wait,
    /// Keep them, frozen, until resumed.
    Keep,
}

/// The service's load: the engine's, and whether it is paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceStats {
    /// The engine's counters.
    pub engine: EngineStats,
    /// Requests held back by a pause (not yet in the engine).
    pub held_back: usize,
    /// Whether generation is paused.
    pub paused: bool,
}

/// The updates of one request's samples, in order; ends after the last
/// sample finished. Dropping it aborts the request.
pub struct SampleStream {
    /// The request's id (for [`EngineHandle::abort`]).
    pub id: RequestId,
    updates: mpsc::UnboundedReceiver<Result<SampleUpdate>>,
    commands: mpsc::UnboundedSender<Command>,
    ended: bool,
}

impl SampleStream {
    /// The next update; `None` once every sample has finished.
    pub async fn next(&mut self) -> Option<Result<SampleUpdate>> {
        let next = self.updates.recv().await;
        if next.is_none() {
            self.ended = true;
        }
        next
    }

    /// Every sample once all have finished, by index.
    pub async fn finished(mut self) -> Result<Vec<Completion>> {
        let mut samples = Vec::new();
        while let Some(update) = self.next().await {
            samples.extend(update?.finished);
        }
        samples.sort_by_key(|s| s.index);
        Ok(samples)
    }
}

impl Drop for SampleStream {
    fn drop(&mut self) {
        if !self.ended {
            // The actor may be gone already; then there is nothing to abort.
            let _ = self.commands.send(Command::Abort {
                id: self.id,
                reply: None,
            });
        }
    }
}

/// A cheap, cloneable handle on the engine's thread.
#[derive(Clone)]
pub struct EngineHandle {
    commands: mpsc::UnboundedSender<Command>,
}

enum Command {
    Generate {
        request: Request,
        updates: mpsc::UnboundedSender<Result<SampleUpdate>>,
        reply: oneshot::Sender<Result<RequestId>>,
    },
    Abort {
        id: RequestId,
        reply: Option<oneshot::Sender<bool>>,
    },
    UpdateWeights {
        version: u64,
        /// The LoRA layout the tensors are adapters of (`None`: model parameters).
        adapters: Option<LoraConfig>,
        tensors: IncomingWeights,
        in_flight: InFlight,
        reply: oneshot::Sender<Result<()>>,
    },
    LoadAdapter {
        lora: LoraConfig,
        tensors: Vec<(String, HostTensor)>,
        reply: oneshot::Sender<Result<AdapterId>>,
    },
    UnloadAdapter {
        id: AdapterId,
        reply: oneshot::Sender<bool>,
    },
    Pause {
        mode: PauseMode,
        reply: oneshot::Sender<()>,
    },
    Resume {
        reply: oneshot::Sender<()>,
    },
    Stats {
        reply: oneshot::Sender<ServiceStats>,
    },
}

impl EngineHandle {
    /// Moves `engine` onto its own thread and returns a handle on it. The
    /// thread ends when every handle (and stream) is dropped.
    pub fn spawn(engine: Engine) -> EngineHandle {
        let (commands, receiver) = mpsc::unbounded_channel();
        thread::Builder::new()
            .name("grpo-engine".to_string())
            .spawn(move || Actor::new(engine).run(receiver))
            .expect("spawning the engine thread");
        EngineHandle { commands }
    }

    async fn call<T>(&self, command: impl FnOnce(oneshot::Sender<T>) -> Command) -> Result<T> {
        let (reply, answer) = oneshot::channel();
        self.commands.send(command(reply)).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())
    }

    /// Whether the engine's thread still runs (answered at once, without
    /// waiting for the step in progress).
    pub fn is_running(&self) -> bool {
        !self.commands.is_closed()
    }

    /// Queues a request; its samples' updates arrive on the returned
    /// stream. A request the engine cannot serve is refused here.
    pub async fn generate(&self, request: Request) -> Result<SampleStream> {
        let (updates, receiver) = mpsc::unbounded_channel();
        let id = self
            .call(|reply| Command::Generate {
                request,
                updates,
                reply,
            })
            .await??;
        Ok(SampleStream {
            id,
            updates: receiver,
            commands: self.commands.clone(),
            ended: false,
        })
    }

    /// Aborts a request; false if it is unknown or finished.
    pub async fn abort(&self, id: RequestId) -> Result<bool> {
        self.call(|reply| Command::Abort { id, reply: Some(reply) }).await
    }

    /// Installs new weights between two steps (see [`Engine::update_weights`]);
    /// shared tensors (an `Arc`) are uploaded without a host copy.
    pub async fn update_weights(
        &self,
        version: u64,
        tensors: impl Into<IncomingWeights>,
        in_flight: InFlight,
    ) -> Result<()> {
        self.call(|reply| Command::UpdateWeights {
            version,
            adapters: None,
            tensors: tensors.into(),
            in_flight,
            reply,
        })
        .await?
    }

    /// Installs LoRA adapters of layout `lora` between two steps (see
    /// [`Engine::update_adapters`]).
    pub async fn update_adapters(
        &self,
        version: u64,
        lora: LoraConfig,
        tensors: impl Into<IncomingWeights>,
        in_flight: InFlight,
    ) -> Result<()> {
        self.call(|reply| Command::UpdateWeights {
            version,
            adapters: Some(lora),
            tensors: tensors.into(),
            in_flight,
            reply,
        })
        .await?
    }

    /// Loads a LoRA adapter into one of the engine's adapter slots between
    /// two steps (see [`Engine::load_adapter`]).
    pub async fn load_adapter(&self, lora: LoraConfig, tensors: Vec<(String, HostTensor)>) -> Result<AdapterId> {
        self.call(|reply| Command::LoadAdapter { lora, tensors, reply }).await?
    }

    /// Unloads an adapter between two steps (see [`Engine::unload_adapter`]);
    /// false if it is not loaded.
    pub async fn unload_adapter(&self, id: AdapterId) -> Result<bool> {
        self.call(|reply| Command::UnloadAdapter { id, reply }).await
    }

    /// Pauses generation (see [`PauseMode`]); returns once paused.
    pub async fn pause(&self, mode: PauseMode) -> Result<()> {
        self.call(|reply| Command::Pause { mode, reply }).await
    }

    /// Resumes generation; held-back requests join the engine.
    pub async fn resume(&self) -> Result<()> {
        self.call(|reply| Command::Resume { reply }).await
    }

    /// The current load.
    pub async fn stats(&self) -> Result<ServiceStats> {
        self.call(|reply| Command::Stats { reply }).await
    }
}

fn stopped() -> Error {
    Error::EngineStopped {
        reason: "its thread has ended".to_string(),
    }
}

/// A request's open stream and how many of its samples are still running.
struct Open {
    updates: mpsc::UnboundedSender<Result<SampleUpdate>>,
    unfinished: usize,
}

/// The engine's thread.
struct Actor {
    engine: Engine,
    open: HashMap<RequestId, Open>,
    paused: bool,
    /// Requests that arrived while paused, with their streams and replies.
    held_back: VecDeque<Command>,
    /// Pause(Wait) callers, answered once the engine is drained.
    draining: Vec<oneshot::Sender<()>>,
}

impl Actor {
    fn new(engine: Engine) -> Actor {
        Actor {
            engine,
            open: HashMap::new(),
            paused: false,
            held_back: VecDeque::new(),
            draining: Vec::new(),
        }
    }

    fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        loop {
            // Paused engines step only to drain for Pause(Wait).
            let stepping = !self.paused || !self.draining.is_empty();
            let busy = stepping && self.engine.has_work();
            let command = if busy {
                match commands.try_recv() {
                    Ok(command) => Some(command),
                    Err(mpsc::error::TryRecvError::Empty) => None,
                    Err(mpsc::error::TryRecvError::Disconnected) => return,
                }
            } else {
                match commands.blocking_recv() {
                    Some(command) => Some(command),
                    None => return,
                }
            };
            if let Some(command) = command {
                self.handle(command);
            } else {
                match self.engine.step() {
                    Ok(updates) => self.dispatch(updates),
                    Err(error) => return self.fail(&error),
                }
            }
            let pending = self.engine.take_updates();
            self.dispatch(pending);
            if !self.draining.is_empty() && !self.engine.has_work() {
                for waiter in self.draining.drain(..) {
                    let _ = waiter.send(());
                }
            }
        }
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Generate { .. } if self.paused => self.held_back.push_back(command),
            // A caller that stopped waiting (while held back by a pause) is dropped.
            Command::Generate { reply, .. } if reply.is_closed() => {}
            Command::Generate {
                request,
                updates,
                reply,
            } => {
                let n = request.params.n;
                let result = self.engine.add_request(request);
                if let Ok(id) = result {
                    self.open.insert(id, Open { updates, unfinished: n });
                }
                let _ = reply.send(result);
            }
            Command::Abort { id, reply } => {
                let found = self.engine.abort(id);
                if let Some(reply) = reply {
                    let _ = reply.send(found);
                }
            }
            Command::UpdateWeights {
                version,
                adapters,
                tensors,
                in_flight,
                reply,
            } => {
                let installed = match tensors {
                    IncomingWeights::F32(tensors) => {
                        install(&mut self.engine, version, adapters.as_ref(), &tensors, in_flight)
                    }
                    IncomingWeights::Bf16(tensors) => {
                        install(&mut self.engine, version, adapters.as_ref(), &tensors, in_flight)
                    }
                };
                let _ = reply.send(installed);
            }
            Command::LoadAdapter { lora, tensors, reply } => {
                let _ = reply.send(self.engine.load_adapter(&lora, &tensors));
            }
            Command::UnloadAdapter { id, reply } => {
                let _ = reply.send(self.engine.unload_adapter(id));
            }
            Command::Pause { mode, reply } => {
                self.paused = true;
                match mode {
                    PauseMode::Abort => {
                        // Requests held back by an earlier pause are aborted too:
                        // their streams open and end at once.
                        let held: Vec<Command> = self.held_back.drain(..).collect();
                        self.paused = false;
                        held.into_iter().for_each(|command| self.handle(command));
                        self.paused = true;
                        for id in self.engine.requests() {
                            self.engine.abort(id);
                        }
                        let _ = reply.send(());
                    }
                    PauseMode::Wait => self.draining.push(reply),
                    PauseMode::Keep => {
                        let _ = reply.send(());
                    }
                }
            }
            Command::Resume { reply } => {
                self.paused = false;
                while let Some(command) = self.held_back.pop_front() {
                    self.handle(command);
                }
                let _ = reply.send(());
            }
            Command::Stats { reply } => {
                let _ = reply.send(ServiceStats {
                    engine: self.engine.stats(),
                    held_back: self.held_back.len(),
                    paused: self.paused,
                });
            }
        }
    }

    /// Sends each update to its request's stream; a stream whose reader is
    /// gone has its request aborted.
    fn dispatch(&mut self, updates: Vec<SampleUpdate>) {
        for update in updates {
            let id = update.request;
            let Some(open) = self.open.get_mut(&id) else {
                continue;
            };
            let finished = update.finished.is_some();
            let delivered = open.updates.send(Ok(update)).is_ok();
            if finished {
                open.unfinished -= 1;
            }
            if !delivered {
                self.engine.abort(id);
                self.open.remove(&id);
            } else if open.unfinished == 0 {
                self.open.remove(&id);
            }
        }
    }

    /// Tells every open stream why the engine stopped.
    fn fail(self, error: &Error) {
        let reason = error.to_string();
        for open in self.open.values() {
            let _ = open.updates.send(Err(Error::EngineStopped { reason: reason.clone() }));
        }
    }
}

/// Installs `tensors` on `engine` as `version`: adapters of layout
/// `adapters`, or model parameters.
fn install<T: ParameterValues>(
    engine: &mut Engine,
    version: u64,
    adapters: Option<&LoraConfig>,
    tensors: &[(String, T)],
    in_flight: InFlight,
) -> Result<()> {
    match adapters {
        Some(lora) => engine.update_adapters(version, lora, tensors, in_flight),
        None => engine.update_weights(version, tensors, in_flight),
    }
}
