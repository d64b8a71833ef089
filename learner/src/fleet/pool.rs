//! [`WorkerFleet`]: rollout workers over gRPC (and optionally the
//! in-process engine) that come and go while the run goes on.
//!
//! Members come from the config's address list, from the learner's
//! registry (`grpo worker --learner ADDR` announces itself, again every few
//! seconds), and from the in-process engine. Every call the fleet makes is
//! a task on its runtime that reports back as an [`Event`]; one loop
//! ([`WorkerFleet::drive`]) handles the events and, every tick:
//!
//! - asks each member for its health every `heartbeat` (a member that does
//!   not answer within `timeout`, or fails any call, is **down**: its
//!   unfinished groups are cancelled and queued again for the others);
//! - pushes the current weights to every member that answers but serves
//!   another version (one that joined, came back, or restarted), before it
//!   gets any work;
//! - gives each queued group to the ready member with the most free room
//!   (assigned samples over its engine slots).
//!
//! **Exactly once**: every call has a ticket; a group's samples are taken
//! only from the call that holds its current ticket, so the late answer of
//! a worker that was declared down (a stalled one that wakes up) is
//! dropped, never counted twice. Every sample's tokens must carry the
//! fleet's version; a worker that restarted on its start-up weights is
//! caught so, its groups requeued and its weights pushed again.
//!
//! With no member ready, generation waits (a status line says why) up to
//! `wait`, then stops the run with each member's state; it stops at once
//! when every member refused for good and no registry can bring others.
//!
//! Memory: one host copy of the current weights (f32, shared with the
//! learner's update), kept for members that join or come back later, and
//! once a worker takes them, their encoding for the wire (2 or 4 bytes a
//! value), made once and streamed to every worker.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use grpo_model::weights::HostTensor;
use grpo_rollout::engine::{Engine, InFlight};
use grpo_rollout::handle::EngineHandle;
use grpo_rollout::output::Completion;
use grpo_rollout::request::Request;
use grpo_worker::{AuthToken, ClientTls, Health, PushOptions, Registration, RegistryServer, ServerTls, WorkerClient};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use super::member::{self, Connection, Failure, Member, Payload, State};
use super::{Fleet, FleetHealth, HostWeights, MemberId, PolicyWeights, Served, SyncReport, f32_bytes};
use crate::error::{Error, Result};

/// How a [`WorkerFleet`] watches its members.
#[derive(Debug, Clone, Copy)]
pub struct FleetConfig {
    /// How weights travel to workers.
    pub push: PushOptions,
    /// How often each member is asked for its health. Default 2 s.
    pub heartbeat: Duration,
    /// A Health call unanswered this long marks the member down and its
    /// groups go to others. Default 10 s.
    pub timeout: Duration,
    /// How long generation waits with no member ready before the run
    /// stops. Default 600 s.
    pub wait: Duration,
}

impl Default for FleetConfig {
    fn default() -> Self {
        FleetConfig {
            push: PushOptions::default(),
            heartbeat: Duration::from_secs(2),
            timeout: Duration::from_secs(10),
            wait: Duration::from_secs(600),
        }
    }
}

/// How often a waiting fleet repeats its status line.
const STATUS_EVERY: Duration = Duration::from_secs(30);

/// What a finished task reports.
enum Event {
    /// A group's samples, or why there are none.
    Generated {
        ticket: u64,
        result: Result<Vec<Completion>, Failure>,
    },
    /// A member's health.
    Pinged {
        member: usize,
        ticket: u64,
        result: Result<Health, Failure>,
    },
    /// A weight push ended.
    Pushed {
        member: usize,
        ticket: u64,
        version: u64,
        result: Result<(), Failure>,
    },
}

/// A group given to a member.
struct Call {
    group: usize,
    member: usize,
    samples: usize,
    task: AbortHandle,
}

/// What one [`WorkerFleet::drive`] works through: the groups of a generate
/// call (none for a weight update), and the bytes pushed meanwhile.
#[derive(Default)]
struct Work {
    /// A weight sync: done once no member is unheard of or behind.
    sync: bool,
    requests: Vec<Request>,
    /// The member each request prefers, if any.
    prefer: Vec<Option<MemberId>>,
    queue: VecDeque<usize>,
    results: Vec<Option<Served>>,
    calls: HashMap<u64, Call>,
    pushed_bytes: u64,
}

impl Work {
    fn generate(requests: &[Request], prefer: &[Option<MemberId>]) -> Work {
        Work {
            requests: requests.to_vec(),
            prefer: prefer.to_vec(),
            queue: (0..requests.len()).collect(),
            results: vec![None; requests.len()],
            ..Work::default()
        }
    }

    fn sync() -> Work {
        Work {
            sync: true,
            ..Work::default()
        }
    }
}

/// Rollout workers over gRPC, and optionally the in-process engine.
pub struct WorkerFleet {
    runtime: tokio::runtime::Runtime,
    config: FleetConfig,
    /// The policy's vocabulary: workers' token ids must be below it.
    vocab_size: usize,
    members: Vec<Member>,
    /// The registry's announcements, and how its workers are called.
    registry: Option<Registry>,
    events: mpsc::UnboundedSender<Event>,
    inbox: mpsc::UnboundedReceiver<Event>,
    /// The fleet's policy version and its weights (for members that join
    /// later).
    version: Option<u64>,
    weights: Option<Payload>,
    next_ticket: u64,
    /// Groups queued again since the start.
    requeued_groups: u64,
}

/// Where workers register, and how the ones that do are called.
struct Registry {
    registrations: mpsc::UnboundedReceiver<Registration>,
    token: AuthToken,
    dial: ClientTls,
}

impl WorkerFleet {
    /// A fleet with no members yet; add them with [`Self::add_workers`],
    /// [`Self::listen`] and [`Self::add_engine`].
    pub fn new(config: FleetConfig, vocab_size: usize) -> Result<WorkerFleet> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| Error::Fleet {
                message: format!("cannot start the gRPC runtime: {e}"),
            })?;
        let (events, inbox) = mpsc::unbounded_channel();
        Ok(WorkerFleet {
            runtime,
            config,
            vocab_size,
            members: Vec::new(),
            registry: None,
            events,
            inbox,
            version: None,
            weights: None,
            next_ticket: 0,
            requeued_groups: 0,
        })
    }

    /// Adds the workers at `endpoints` (`host:port` or URLs), called with
    /// `token` over TLS as `tls` says. They need not be up yet: they join
    /// when they answer.
    pub fn add_workers(&mut self, endpoints: &[String], token: &AuthToken, tls: &ClientTls) -> Result<()> {
        let _entered = self.runtime.enter();
        for endpoint in endpoints {
            let client = WorkerClient::connect_lazy(endpoint, token, tls).map_err(|e| Error::Worker {
                endpoint: endpoint.clone(),
                message: e.to_string(),
            })?;
            self.members
                .push(Member::new(endpoint.clone(), Connection::Remote(client)));
        }
        Ok(())
    }

    /// Takes registrations of workers carrying `token` on `addr` (over TLS
    /// with `tls`, if given) and calls the workers registered as `dial`
    /// says; returns the address bound (its port picked if 0 was given).
    pub fn listen(
        &mut self,
        addr: SocketAddr,
        token: AuthToken,
        tls: Option<ServerTls>,
        dial: ClientTls,
    ) -> Result<SocketAddr> {
        let announce_every = self.config.heartbeat;
        let (mut server, registrations) = self
            .runtime
            .block_on(RegistryServer::bind(addr, token.clone(), announce_every))
            .map_err(|e| Error::Fleet { message: e.to_string() })?;
        if let Some(tls) = tls {
            server = server.with_tls(tls);
        }
        let bound = server.local_addr();
        self.runtime.spawn(async move {
            if let Err(e) = server.serve().await {
                tracing::error!("the worker registry at {bound} stopped: {e}");
            }
        });
        self.registry = Some(Registry {
            registrations,
            token,
            dial,
        });
        Ok(bound)
    }

    /// Adds an in-process engine, called `name` in logs (moved onto its
    /// own thread); returns a handle on it (for its stats).
    pub fn add_engine(&mut self, name: String, engine: Engine) -> EngineHandle {
        let handle = EngineHandle::spawn(engine);
        self.members.push(Member::new(name, Connection::Local(handle.clone())));
        handle
    }

    fn ticket(&mut self) -> u64 {
        self.next_ticket += 1;
        self.next_ticket
    }

    /// Adds registered workers not known yet; asks a known one that is down
    /// at once whether it is back.
    fn take_registrations(&mut self) {
        let Some(Registry {
            registrations,
            token,
            dial,
        }) = &mut self.registry
        else {
            return;
        };
        let _entered = self.runtime.enter();
        while let Ok(Registration { address }) = registrations.try_recv() {
            match self.members.iter_mut().find(|m| m.name == address) {
                // Announcing again: a worker that was down, or refused (it may
                // have been replaced by a fixed one), is asked at once.
                Some(known) => {
                    if matches!(known.state, State::Down(_) | State::Refused(_)) {
                        if matches!(known.state, State::Refused(_)) {
                            known.state = State::Unknown;
                        }
                        known.next_ping = Instant::now();
                    }
                }
                None => match WorkerClient::connect_lazy(&address, token, dial) {
                    Ok(client) => {
                        tracing::info!("rollout worker {address} registered");
                        self.members.push(Member::new(address, Connection::Remote(client)));
                    }
                    Err(e) => tracing::warn!("rollout worker {address} registered, but cannot be called: {e}"),
                },
            }
        }
    }

    /// Asks every member due for its health, and pushes the current weights
    /// to every member behind.
    fn housekeeping(&mut self) {
        self.take_registrations();
        let now = Instant::now();
        for index in 0..self.members.len() {
            let member = &self.members[index];
            if matches!(member.state, State::Refused(_)) {
                continue;
            }
            if member.ping.is_none() && now >= member.next_ping {
                self.start_ping(index, now);
            }
            let member = &self.members[index];
            if member.state == State::Behind && member.push.is_none() {
                self.start_push(index);
            }
        }
    }

    fn start_ping(&mut self, index: usize, now: Instant) {
        let ticket = self.ticket();
        let (connection, deadline, events) = (
            self.members[index].connection.clone(),
            self.config.timeout,
            self.events.clone(),
        );
        let task = self.runtime.spawn(async move {
            let result = member::ping(connection, deadline).await;
            let _ = events.send(Event::Pinged {
                member: index,
                ticket,
                result,
            });
        });
        let member = &mut self.members[index];
        member.ping = Some((ticket, task.abort_handle()));
        member.next_ping = now + self.config.heartbeat;
    }

    fn start_push(&mut self, index: usize) {
        let (Some(version), Some(weights)) = (self.version, self.weights.clone()) else {
            return;
        };
        let ticket = self.ticket();
        let (connection, options, events) = (
            self.members[index].connection.clone(),
            self.config.push,
            self.events.clone(),
        );
        let task = self.runtime.spawn(async move {
            let result = member::push(connection, version, weights, options).await;
            let _ = events.send(Event::Pushed {
                member: index,
                ticket,
                version,
                result,
            });
        });
        self.members[index].push = Some((ticket, task.abort_handle()));
    }

    /// Gives queued groups to the ready members with the most free room.
    fn dispatch(&mut self, work: &mut Work) {
        while let Some(&group) = work.queue.front() {
            let samples = work.requests[group].params.n;
            let preferred = work.prefer[group].filter(|&i| self.members.get(i).is_some_and(Member::ready));
            let Some(index) = preferred.or_else(|| {
                (0..self.members.len())
                    .filter(|&i| self.members[i].ready())
                    .min_by(|&a, &b| {
                        let (a, b) = (&self.members[a], &self.members[b]);
                        a.load_with(samples).total_cmp(&b.load_with(samples))
                    })
            }) else {
                return;
            };
            work.queue.pop_front();
            let ticket = self.ticket();
            let (connection, request, events, vocab_size) = (
                self.members[index].connection.clone(),
                work.requests[group].clone(),
                self.events.clone(),
                self.vocab_size,
            );
            let task = self.runtime.spawn(async move {
                let result = member::generate(connection, request, vocab_size).await;
                let _ = events.send(Event::Generated { ticket, result });
            });
            self.members[index].assigned += samples;
            let call = Call {
                group,
                member: index,
                samples,
                task: task.abort_handle(),
            };
            work.calls.insert(ticket, call);
        }
    }

    /// Queues `group` again, for another member.
    fn requeue(&mut self, work: &mut Work, group: usize) {
        work.queue.push_front(group);
        self.requeued_groups += 1;
    }

    /// Cancels the member's calls and queues their groups again; returns how many.
    fn requeue_calls(&mut self, work: &mut Work, index: usize) -> usize {
        let tickets: Vec<u64> = work
            .calls
            .iter()
            .filter(|(_, call)| call.member == index)
            .map(|(&ticket, _)| ticket)
            .collect();
        for ticket in &tickets {
            let call = work.calls.remove(ticket).expect("listed above");
            call.task.abort();
            self.requeue(work, call.group);
        }
        self.members[index].assigned = 0;
        tickets.len()
    }

    /// Marks the member down (or refused), cancels what it was doing and
    /// queues its groups again.
    fn fail(&mut self, work: &mut Work, index: usize, failure: Failure) {
        let requeued = self.requeue_calls(work, index);
        let member = &mut self.members[index];
        for (_, task) in member.ping.take().into_iter().chain(member.push.take()) {
            task.abort();
        }
        let again = if requeued > 0 {
            format!("; {requeued} of its groups go to other workers")
        } else {
            String::new()
        };
        if failure.permanent {
            // A refused worker that keeps announcing itself is refused again each time: said once.
            if member.refused_for.as_deref() != Some(failure.message.as_str()) {
                tracing::error!("rollout worker {} refused: {}{again}", member.name, failure.message);
                member.refused_for = Some(failure.message.clone());
            }
            member.state = State::Refused(failure.message);
        } else {
            if !matches!(member.state, State::Down(_)) || requeued > 0 {
                tracing::warn!("rollout worker {} is down: {}{again}", member.name, failure.message);
            }
            member.state = State::Down(failure.message);
        }
    }

    /// Cancels the member's ping in flight, whose answer may predate what
    /// just changed, and asks again after a heartbeat.
    fn forget_ping(&mut self, index: usize) {
        let member = &mut self.members[index];
        if let Some((_, task)) = member.ping.take() {
            task.abort();
        }
        member.next_ping = Instant::now() + self.config.heartbeat;
    }

    fn handle(&mut self, work: &mut Work, event: Event) {
        match event {
            Event::Generated { ticket, result } => {
                // A call cancelled meanwhile (its member was declared down): dropped.
                let Some(call) = work.calls.remove(&ticket) else {
                    return;
                };
                let index = call.member;
                self.members[index].assigned -= call.samples;
                match result {
                    Ok(group) => match group
                        .iter()
                        .flat_map(|c| &c.versions)
                        .find(|&&v| Some(v) != self.version)
                    {
                        None => {
                            work.results[call.group] = Some(Served {
                                completions: group,
                                member: index,
                            })
                        }
                        Some(served) => {
                            self.requeue(work, call.group);
                            let requeued = 1 + self.requeue_calls(work, index);
                            let member = &mut self.members[index];
                            tracing::warn!(
                                "rollout worker {} served policy version {served}, not the fleet's {} \
                                 (it restarted?): {requeued} groups go to other workers, and it gets the weights again",
                                member.name,
                                self.version.unwrap_or_default()
                            );
                            member.state = State::Behind;
                        }
                    },
                    Err(failure) => {
                        self.requeue(work, call.group);
                        self.fail(work, index, failure);
                    }
                }
            }
            Event::Pinged { member, ticket, result } => {
                if self.members[member].ping.as_ref().map(|(t, _)| *t) != Some(ticket) {
                    return;
                }
                self.members[member].ping = None;
                match result {
                    Ok(health) => self.answered(work, member, health),
                    Err(failure) => self.fail(work, member, failure),
                }
            }
            Event::Pushed {
                member,
                ticket,
                version,
                result,
            } => {
                if self.members[member].push.as_ref().map(|(t, _)| *t) != Some(ticket) {
                    return;
                }
                self.members[member].push = None;
                match result {
                    Ok(()) => {
                        work.pushed_bytes += self.wire_bytes(member);
                        self.forget_ping(member);
                        self.members[member].installed = Some(version);
                        self.members[member].state = if Some(version) == self.version {
                            State::Ready
                        } else {
                            State::Behind
                        };
                    }
                    Err(failure) => self.fail(work, member, failure),
                }
            }
        }
    }

    /// A member answered Health.
    fn answered(&mut self, work: &mut Work, index: usize, health: Health) {
        let member = &mut self.members[index];
        member.slots = health.max_num_seqs.max(1);
        let restarted = member.instance.is_some_and(|i| i != health.instance);
        if restarted {
            // Another process: nothing this fleet installed is on it.
            member.installed = None;
        }
        member.instance = Some(health.instance);
        let current =
            self.version.is_some() && member.installed == self.version && Some(health.version) == self.version;
        match &member.state {
            State::Ready if !current => {
                tracing::warn!(
                    "rollout worker {} {}: it gets the current weights again",
                    member.name,
                    if restarted {
                        "restarted"
                    } else {
                        "serves other weights than it was given"
                    },
                );
                member.state = State::Behind;
                // What it was generating, it generates on other weights.
                self.requeue_calls(work, index);
            }
            State::Unknown | State::Down(_) => {
                tracing::info!(
                    "rollout worker {} answers ({} slots, policy version {}){}",
                    member.name,
                    member.slots,
                    health.version,
                    if current {
                        ""
                    } else {
                        ": it gets the current weights first"
                    }
                );
                member.state = if current { State::Ready } else { State::Behind };
            }
            _ => {}
        }
    }

    /// Bytes of values one push of the current weights sends to the member.
    fn wire_bytes(&self, index: usize) -> u64 {
        let f32 = self.weights.as_ref().map_or(0, |w| f32_bytes(&w.tensors));
        match self.members[index].connection {
            Connection::Remote(_) => f32 / 4 * self.config.push.dtype.element_bytes() as u64,
            Connection::Local(_) => f32,
        }
    }

    /// Each member's state, for status lines and errors.
    fn summary(&self) -> String {
        if self.members.is_empty() {
            return "no worker has registered or been listed".to_string();
        }
        let states: Vec<String> = self
            .members
            .iter()
            .map(|m| match &m.state {
                State::Unknown => format!("{}: not answered yet", m.name),
                State::Behind => format!("{}: taking the current weights", m.name),
                State::Ready => format!("{}: ready", m.name),
                State::Down(why) => format!("{}: down ({why})", m.name),
                State::Refused(why) => format!("{}: refused ({why})", m.name),
            })
            .collect();
        states.join("; ")
    }

    /// Handles events until `work` is done: its groups generated, or (for
    /// none) every member that answers on the current weights.
    fn drive(&mut self, mut work: Work) -> Result<Work> {
        let tick = (self.config.heartbeat / 4).clamp(Duration::from_millis(10), Duration::from_millis(500));
        let mut waiting: Option<(Instant, Instant)> = None;
        loop {
            self.housekeeping();
            self.dispatch(&mut work);
            let done = if work.sync {
                !self
                    .members
                    .iter()
                    .any(|m| matches!(m.state, State::Unknown | State::Behind))
            } else {
                work.results.iter().all(Option::is_some)
            };
            if done {
                return Ok(work);
            }
            if work.queue.is_empty() || self.members.iter().any(Member::ready) {
                waiting = None;
            } else {
                self.wait_for_workers(&mut waiting)?;
            }
            let event = self.runtime.block_on(async {
                tokio::select! {
                    event = self.inbox.recv() => event,
                    () = tokio::time::sleep(tick) => None,
                }
            });
            if let Some(event) = event {
                self.handle(&mut work, event);
            }
        }
    }

    /// With groups queued and no member ready: a status line now and then,
    /// and the run's end once waiting is hopeless or past `wait`.
    fn wait_for_workers(&self, waiting: &mut Option<(Instant, Instant)>) -> Result<()> {
        let now = Instant::now();
        let (since, said) = waiting.get_or_insert((now, now - STATUS_EVERY));
        let hopeless = self.registry.is_none() && self.members.iter().all(|m| matches!(m.state, State::Refused(_)));
        if hopeless || now.duration_since(*since) > self.config.wait {
            return Err(Error::Fleet {
                message: format!(
                    "no rollout worker is ready after {:.0} s: {}",
                    now.duration_since(*since).as_secs_f64(),
                    self.summary()
                ),
            });
        }
        if now.duration_since(*said) >= STATUS_EVERY {
            *said = now;
            tracing::warn!(
                "waiting for a rollout worker (the run stops after {:.0} s without one): {}",
                self.config.wait.as_secs_f64(),
                self.summary()
            );
        }
        Ok(())
    }
}

impl Fleet for WorkerFleet {
    fn generate_preferring(&mut self, requests: &[Request], prefer: &[Option<MemberId>]) -> Result<Vec<Served>> {
        let work = self.drive(Work::generate(requests, prefer))?;
        Ok(work.results.into_iter().map(|r| r.expect("a finished work")).collect())
    }

    fn update_weights(&mut self, version: u64, weights: PolicyWeights) -> Result<SyncReport> {
        let payload = match weights {
            PolicyWeights::Host(tensors) => Payload::new(tensors),
            PolicyWeights::Adapters { lora, tensors } => Payload::adapters(lora, tensors),
            PolicyWeights::Device { .. } => {
                return Err(Error::Fleet {
                    message: "weights on a device go only to a lone in-process engine (Fleet::shared_device)"
                        .to_string(),
                });
            }
        };
        let started = Instant::now();
        self.version = Some(version);
        self.weights = Some(payload);
        for index in 0..self.members.len() {
            self.forget_ping(index);
            let member = &mut self.members[index];
            if let Some((_, task)) = member.push.take() {
                task.abort();
            }
            if member.state == State::Ready {
                member.state = State::Behind;
            }
        }
        let work = self.drive(Work::sync())?;
        Ok(SyncReport {
            bytes: work.pushed_bytes,
            seconds: started.elapsed().as_secs_f64(),
        })
    }

    fn start_at(&mut self, version: u64, weights: &dyn Fn() -> Result<Vec<(String, HostTensor)>>) -> Result<()> {
        // The in-process engine holds these weights already: it only takes the version.
        for member in &mut self.members {
            if let Connection::Local(handle) = &member.connection {
                self.runtime
                    .block_on(handle.update_weights(version, HostWeights::from([]), InFlight::Keep))?;
                member.installed = Some(version);
            }
        }
        self.version = Some(version);
        let remote = self.registry.is_some()
            || self
                .members
                .iter()
                .any(|m| matches!(m.connection, Connection::Remote(_)));
        if remote {
            self.weights = Some(Payload::new(weights()?.into()));
        }
        self.drive(Work::sync()).map(|_| ())
    }

    fn shared_device(&self) -> Option<(i32, grpo_xla::ElementType)> {
        None // workers need host tensors, and weights go to every member alike
    }

    fn health(&self) -> FleetHealth {
        FleetHealth {
            members: self.members.len(),
            ready: self.members.iter().filter(|m| m.ready()).count(),
            requeued_groups: self.requeued_groups,
        }
    }
}
