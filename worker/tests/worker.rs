//! The rollout worker over real gRPC on 127.0.0.1 with the tiny llama
//! fixture: Generate streams what the engine generates; a weight update
//! pushed in chunks (f32, bf16) in the middle of a sample makes its later
//! tokens follow the new weights and carry the new version; corrupt,
//! incomplete, misshapen or non-finite updates are refused and the old
//! weights keep serving; every call needs the token; pause (keep, abort,
//! wait), resume, cancellation, health and stats.

#[path = "../../rollout/tests/common/mod.rs"]
mod common;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::fixture;
use grpo_model::config::ModelConfig;
use grpo_model::weights::HostTensor;
use grpo_rollout::engine::{Engine, InFlight};
use grpo_rollout::handle::{PauseMode, ServiceStats};
use grpo_rollout::output::{Completion, FinishReason};
use grpo_rollout::request::{Request, SamplingParams};
use grpo_worker::proto::rollout_worker_client::RolloutWorkerClient;
use grpo_worker::{
    AuthToken, ClientTls, EncodedUpdate, Health, PROTOCOL_VERSION, PushOptions, RemoteSamples, WireDtype, WorkerClient,
    WorkerError, WorkerServer, proto,
};
use grpo_xla::{Client, ElementType};
use tonic::Code;

const SLOTS: usize = 4;
const MAX_MODEL_LEN: usize = 64;

/// One CPU client for the whole file, so its tests share compiled programs.
fn cpu_client() -> Client {
    static CLIENT: OnceLock<Client> = OnceLock::new();
    CLIENT.get_or_init(common::cpu_client).clone()
}

fn token() -> AuthToken {
    AuthToken::new("worker-test-token").unwrap()
}

fn engine(client: &Client) -> Engine {
    common::engine(client, fixture("llama").to_str().unwrap(), SLOTS, MAX_MODEL_LEN)
}

/// A worker serving a fresh fixture engine on a free loopback port, and a client of it.
async fn worker(client: &Client) -> (WorkerClient, String) {
    serve(engine(client)).await
}

/// A worker serving `engine` on a free loopback port, and a client of it.
async fn serve(engine: Engine) -> (WorkerClient, String) {
    let server = WorkerServer::bind("127.0.0.1:0".parse().unwrap(), engine, token())
        .await
        .unwrap();
    let addr = server.local_addr();
    assert!(addr.ip().is_loopback());
    tokio::spawn(server.serve());
    let endpoint = addr.to_string();
    (
        WorkerClient::connect(&endpoint, &token(), &ClientTls::default())
            .await
            .unwrap(),
        endpoint,
    )
}

fn request(max_tokens: usize, temperature: f32, n: usize, seed: u32) -> Request {
    Request {
        prompt: vec![17, 99, 3, 64, 120],
        params: SamplingParams {
            n,
            max_tokens,
            temperature,
            seed,
            ignore_eos: true,
            ..SamplingParams::default()
        },
    }
}

/// A sample long enough to be caught running.
fn long() -> Request {
    request(MAX_MODEL_LEN - 6, 0.9, 1, 5)
}

async fn generate(worker: &mut WorkerClient, request: &Request) -> Vec<Completion> {
    worker.generate(request).await.unwrap().all().await.unwrap()
}

/// Polls the worker's stats until `done` holds (at most 10 s).
async fn until(worker: &mut WorkerClient, done: impl Fn(&ServiceStats) -> bool) -> ServiceStats {
    let start = Instant::now();
    loop {
        let stats = worker.stats().await.unwrap();
        if done(&stats) {
            return stats;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "stuck at {stats:?}");
        tokio::task::yield_now().await;
    }
}

/// Starts `long()` and returns its samples' stream once the worker runs it.
/// On a loaded machine the sample can finish between two polls; then it is
/// started again (same seed, same tokens).
async fn start_long(worker: &mut WorkerClient) -> RemoteSamples {
    let tokens = long().params.max_tokens as u64;
    for _ in 0..20 {
        let before = worker.stats().await.unwrap().engine.generated_tokens;
        let samples = worker.generate(&long()).await.unwrap();
        let start = Instant::now();
        loop {
            let stats = worker.stats().await.unwrap();
            if stats.engine.running == 1 {
                return samples;
            }
            if stats.engine.generated_tokens >= before + tokens {
                break; // finished unseen: again
            }
            assert!(start.elapsed() < Duration::from_secs(10), "stuck at {stats:?}");
            tokio::task::yield_now().await;
        }
    }
    panic!("the long sample never was seen running");
}

/// Freshly initialized weights for the fixture, as `dtype` delivers them.
fn new_weights(seed: u64, dtype: WireDtype) -> Vec<(String, HostTensor)> {
    let config = ModelConfig::from_file(fixture("llama").join("config.json")).unwrap();
    let mut weights: Vec<(String, HostTensor)> = grpo_model::init::random_weights(&config, seed)
        .unwrap()
        .into_iter()
        .collect();
    if dtype == WireDtype::Bf16 {
        for (_, tensor) in &mut weights {
            for value in &mut tensor.data {
                *value = half::bf16::from_f32(*value).to_f32();
            }
        }
    }
    weights
}

fn code(error: WorkerError) -> Code {
    match error {
        WorkerError::Rpc { code, .. } => code,
        other => panic!("not a gRPC status: {other}"),
    }
}

fn refusal(error: WorkerError, code_wanted: Code, needle: &str) {
    let message = error.to_string();
    assert_eq!(code(error), code_wanted, "{message}");
    assert!(message.contains(needle), "{message} should say {needle}");
}

#[tokio::test(flavor = "multi_thread")]
async fn generate_streams_what_the_engine_generates() {
    let client = cpu_client();
    let (mut worker, _) = worker(&client).await;
    let mut reference = engine(&client);
    let mut with_top = request(6, 0.0, 1, 0);
    with_top.params.logprobs = Some(3);
    for request in [request(8, 0.0, 1, 0), request(7, 1.0, 3, 42), with_top] {
        let remote = generate(&mut worker, &request).await;
        let local = reference.generate(std::slice::from_ref(&request)).unwrap().remove(0);
        assert_eq!(remote, local, "{request:?}");
        assert!(remote.iter().all(|c| c.versions.iter().all(|&v| v == 0)));
    }
    // Requests in flight together: the tokens each gets alone.
    let requests: Vec<Request> = (0..3).map(|i| request(5 + i, 0.8, 1, 100 + i as u32)).collect();
    let calls = requests.iter().map(|request| {
        let mut worker = worker.clone();
        let request = request.clone();
        tokio::spawn(async move { generate(&mut worker, &request).await })
    });
    let together: Vec<Vec<Completion>> = join_all(calls).await;
    for (request, remote) in requests.iter().zip(together) {
        let local = reference.generate(std::slice::from_ref(request)).unwrap().remove(0);
        assert_eq!(remote[0].tokens, local[0].tokens, "{request:?}");
    }
    // A request the engine cannot serve is refused with the reason.
    let error = worker.generate(&request(MAX_MODEL_LEN, 0.0, 1, 0)).await.err().unwrap();
    refusal(error, Code::InvalidArgument, "max_tokens");
}

/// Awaits spawned tasks in order.
async fn join_all<T>(tasks: impl Iterator<Item = tokio::task::JoinHandle<T>>) -> Vec<T> {
    let tasks: Vec<_> = tasks.collect();
    let mut results = Vec::with_capacity(tasks.len());
    for task in tasks {
        results.push(task.await.unwrap());
    }
    results
}

/// What the engine gives `request` when `update` lands after `steps` of its tokens.
fn updated_after(client: &Client, request: &Request, steps: usize, update: &[(String, HostTensor)]) -> Completion {
    let mut engine = engine(client);
    engine.add_request(request.clone()).unwrap();
    let mut done = None;
    for step in 0.. {
        if step == steps {
            engine.update_weights(1, update, InFlight::Keep).unwrap();
        }
        if !engine.has_work() {
            break;
        }
        done = engine.step().unwrap().into_iter().find_map(|u| u.finished).or(done);
    }
    done.unwrap()
}

/// Pushes new weights while `long()` runs (paused around the push when
/// `pause`), then checks the sample and the next request against engines.
async fn push_mid_generation(dtype: WireDtype, pause: bool) {
    let client = cpu_client();
    let (mut worker, _) = worker(&client).await;
    let update = new_weights(7, dtype);
    // Running means admitted and decoded once: at least one version-0 token.
    let mut samples = start_long(&mut worker).await;
    if pause {
        worker.pause(PauseMode::Keep).await.unwrap();
    }
    let options = PushOptions {
        dtype,
        chunk_bytes: 256,
        in_flight: InFlight::Keep,
    };
    worker.push_weights(1, &update, &options).await.unwrap();
    if pause {
        worker.resume().await.unwrap();
    }
    let sample = samples.next().await.unwrap().unwrap();
    assert!(samples.next().await.unwrap().is_none());
    let old = sample.versions.iter().take_while(|&&v| v == 0).count();
    assert!(
        old >= 1 && old < sample.tokens.len(),
        "the update landed mid-sample: {:?}",
        sample.versions
    );
    assert!(sample.versions[old..].iter().all(|&v| v == 1), "{:?}", sample.versions);
    assert_eq!(sample, updated_after(&client, &long(), old, &update), "{dtype:?}");
    // The next request is what a fresh engine with the new weights generates.
    let next = request(10, 0.7, 2, 9);
    let mut fresh = engine(&client);
    fresh.update_weights(1, &update, InFlight::Keep).unwrap();
    let want = fresh.generate(std::slice::from_ref(&next)).unwrap().remove(0);
    assert_eq!(generate(&mut worker, &next).await, want);
    let health = worker.health().await.unwrap();
    assert_eq!((health.paused, health.version), (false, 1));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_f32_update_pushed_mid_generation_serves_its_later_tokens() {
    push_mid_generation(WireDtype::F32, false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bf16_update_pushed_while_paused_serves_the_rest_of_the_sample() {
    push_mid_generation(WireDtype::Bf16, true).await;
}

/// A bf16 worker stages a push in bf16, whatever the wire carries: it
/// then generates what a local bf16 engine given the f32 tensors does.
#[tokio::test(flavor = "multi_thread")]
async fn a_bf16_worker_installs_a_push_as_a_local_bf16_engine_does() {
    let client = cpu_client();
    let bf16_engine = || {
        common::engine_in(
            &client,
            0,
            fixture("llama").to_str().unwrap(),
            SLOTS,
            MAX_MODEL_LEN,
            ElementType::Bf16,
        )
    };
    let (mut worker, _) = serve(bf16_engine()).await;
    let next = request(10, 0.7, 2, 9);
    for (version, dtype) in [(1, WireDtype::F32), (2, WireDtype::Bf16)] {
        let update = new_weights(version + 10, dtype);
        let options = PushOptions {
            dtype,
            chunk_bytes: 256,
            in_flight: InFlight::Keep,
        };
        worker.push_weights(version, &update, &options).await.unwrap();
        let mut local = bf16_engine();
        local.update_weights(version, &update, InFlight::Keep).unwrap();
        let want = local.generate(std::slice::from_ref(&next)).unwrap().remove(0);
        let got = generate(&mut worker, &next).await;
        assert_eq!(got, want, "{dtype:?}");
        assert!(got.iter().all(|c| c.versions.iter().all(|&v| v == version)));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn refused_updates_leave_the_old_weights_serving() {
    let client = cpu_client();
    let (mut worker, _) = worker(&client).await;
    let probe = request(12, 0.0, 1, 0);
    let before = generate(&mut worker, &probe).await;
    let update = new_weights(3, WireDtype::F32);
    let encoded = EncodedUpdate::new(1, (&update, None), WireDtype::F32, 512, InFlight::Keep);
    let start = || encoded.start.clone();
    let chunks = || encoded.chunks.clone();

    // A corrupt chunk: refused on arrival, and the finish says why.
    let mut corrupt = chunks();
    corrupt[3].data[5] ^= 0x40;
    worker.start_weight_update(start()).await.unwrap();
    let error = worker.send_weight_chunks(corrupt.into_iter()).await.unwrap_err();
    refusal(error, Code::InvalidArgument, "checksum");
    let error = worker.finish_weight_update(1).await.unwrap_err();
    refusal(error, Code::FailedPrecondition, "was rejected");
    let error = worker.send_weight_chunks(chunks().into_iter()).await.unwrap_err();
    refusal(error, Code::FailedPrecondition, "was rejected");

    // A missing chunk: refused at the finish.
    let mut missing = chunks();
    missing.remove(2);
    worker.start_weight_update(start()).await.unwrap();
    worker.send_weight_chunks(missing.into_iter()).await.unwrap();
    let error = worker.finish_weight_update(1).await.unwrap_err();
    refusal(error, Code::InvalidArgument, "never arrived");

    // A wrong shape: refused at the start.
    let mut misshapen = start();
    misshapen.tensors[0].shape.reverse();
    let error = worker.start_weight_update(misshapen).await.unwrap_err();
    refusal(error, Code::InvalidArgument, "shape");

    // Intact chunks of a non-finite tensor: the engine refuses it at the finish.
    let mut poisoned = update.clone();
    poisoned[1].1.data[0] = f32::INFINITY;
    let options = PushOptions::default();
    let error = worker.push_weights(1, &poisoned, &options).await.unwrap_err();
    refusal(error, Code::InvalidArgument, "non-finite");

    let error = worker.finish_weight_update(1).await.unwrap_err();
    refusal(error, Code::FailedPrecondition, "was rejected");
    assert_eq!(worker.health().await.unwrap().version, 0);
    // The same tokens, log-probs within round-off: the worker's engine keeps
    // the first answer's slot, so this one decodes in another row.
    let still = generate(&mut worker, &probe).await;
    assert_eq!(still[0].tokens, before[0].tokens, "the old weights still serve");
    assert!(
        still[0]
            .logprobs
            .iter()
            .zip(&before[0].logprobs)
            .all(|(a, b)| (a - b).abs() < 1e-5),
        "the old weights still serve: {still:?} vs {before:?}"
    );

    // A good update after the refused ones installs.
    worker.push_weights(2, &update, &options).await.unwrap();
    let after = generate(&mut worker, &probe).await;
    assert_ne!(after[0].tokens, before[0].tokens);
    assert!(after[0].versions.iter().all(|&v| v == 2));
    let error = worker.finish_weight_update(2).await.unwrap_err();
    refusal(error, Code::FailedPrecondition, "no weight update is staged");
    let too_big = PushOptions {
        chunk_bytes: 8 << 20,
        ..options
    };
    let error = worker.push_weights(3, &update, &too_big).await.unwrap_err();
    assert!(matches!(error, WorkerError::ChunkSize { .. }), "{error}");
}

#[tokio::test(flavor = "multi_thread")]
async fn every_call_needs_the_token() {
    let client = cpu_client();
    let (mut worker, endpoint) = worker(&client).await;
    let mut wrong = WorkerClient::connect(
        &endpoint,
        &AuthToken::new("not-the-token").unwrap(),
        &ClientTls::default(),
    )
    .await
    .unwrap();
    let update = new_weights(1, WireDtype::F32);
    let encoded = EncodedUpdate::new(1, (&update, None), WireDtype::F32, 1 << 20, InFlight::Keep);
    let errors = [
        wrong.generate(&request(4, 0.0, 1, 0)).await.err().unwrap(),
        wrong.start_weight_update(encoded.start.clone()).await.unwrap_err(),
        wrong
            .send_weight_chunks(encoded.chunks.iter().cloned())
            .await
            .unwrap_err(),
        wrong.finish_weight_update(1).await.unwrap_err(),
        wrong.pause(PauseMode::Keep).await.unwrap_err(),
        wrong.resume().await.unwrap_err(),
        wrong.health().await.unwrap_err(),
        wrong.stats().await.unwrap_err(),
    ];
    for error in errors {
        assert_eq!(code(error), Code::Unauthenticated);
    }
    // No token at all.
    let mut bare = RolloutWorkerClient::connect(format!("http://{endpoint}"))
        .await
        .unwrap();
    let status = bare.health(proto::HealthRequest {}).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);
    assert!(status.message().contains("Bearer"), "{status}");
    // None of it reached the engine.
    let stats = worker.stats().await.unwrap();
    assert_eq!((stats.engine.version, stats.paused), (0, false));
}

#[tokio::test(flavor = "multi_thread")]
async fn pause_keeps_aborts_or_waits_and_resume_goes_on() {
    let client = cpu_client();
    let (mut worker, _) = worker(&client).await;
    let stats = worker.stats().await.unwrap();
    assert_eq!(
        (stats.engine.waiting, stats.engine.running, stats.engine.free_slots),
        (0, 0, SLOTS)
    );
    assert_eq!((stats.engine.version, stats.held_back, stats.paused), (0, 0, false));
    let want = engine(&client).generate(&[long()]).unwrap().remove(0);

    // Keep: the sample freezes, new requests wait; both go on after Resume,
    // the frozen one with the tokens it gets unpaused (log-probs may differ
    // in the last bits: the joining request changes the batch's programs).
    let mut kept = start_long(&mut worker).await;
    worker.pause(PauseMode::Keep).await.unwrap();
    let health = worker.health().await.unwrap();
    assert_eq!(
        health,
        Health {
            paused: true,
            version: 0,
            protocol_version: PROTOCOL_VERSION,
            max_num_seqs: SLOTS,
            instance: health.instance,
        }
    );
    let mut other = worker.clone();
    let later = tokio::spawn(async move { generate(&mut other, &request(3, 0.0, 1, 0)).await });
    let stats = until(&mut worker, |s| s.held_back == 1).await;
    assert_eq!((stats.engine.running, stats.paused), (1, true));
    worker.resume().await.unwrap();
    let sample = kept.next().await.unwrap().unwrap();
    assert_eq!((&sample.tokens, &sample.versions), (&want[0].tokens, &want[0].versions));
    assert_eq!(later.await.unwrap()[0].tokens.len(), 3);

    // Abort: the running sample ends early.
    let mut aborted = start_long(&mut worker).await;
    worker.pause(PauseMode::Abort).await.unwrap();
    let sample = aborted.next().await.unwrap().unwrap();
    assert_eq!(sample.finish_reason, FinishReason::Abort);
    assert!(!sample.tokens.is_empty() && sample.tokens.len() < long().params.max_tokens);
    worker.resume().await.unwrap();

    // Wait: Pause returns once the sample has finished.
    let mut waited = start_long(&mut worker).await;
    worker.pause(PauseMode::Wait).await.unwrap();
    let stats = worker.stats().await.unwrap();
    assert_eq!((stats.engine.running, stats.paused), (0, true));
    let sample = waited.next().await.unwrap().unwrap();
    assert_eq!(sample.finish_reason, FinishReason::Length);
    worker.resume().await.unwrap();

    // Cancelling a call aborts its request (paused, so only the abort can free the slot).
    let cancelled = start_long(&mut worker).await;
    worker.pause(PauseMode::Keep).await.unwrap();
    drop(cancelled);
    until(&mut worker, |s| s.engine.running == 0 && s.engine.free_slots == SLOTS).await;
    worker.resume().await.unwrap();
    assert!(worker.stats().await.unwrap().engine.compiled_programs > 0);
}

/// The standard gRPC health service answers without the token — SERVING
/// for the server and the worker's service while it serves, NOT_SERVING
/// once it drains — so probes (Kubernetes' `grpc`) need no secret.
#[tokio::test(flavor = "multi_thread")]
async fn the_grpc_health_service_says_serving_until_the_worker_drains() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let client = cpu_client();
    let server = WorkerServer::bind("127.0.0.1:0".parse().unwrap(), engine(&client), token())
        .await
        .unwrap();
    let endpoint = format!("http://{}", server.local_addr());
    let (drain, draining) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.serve_until(async {
        let _ = draining.await;
    }));
    let channel = tonic::transport::Endpoint::from_shared(endpoint)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut probe = HealthClient::new(channel);
    let status = |service: &str| HealthCheckRequest {
        service: service.to_string(),
    };
    for service in ["", "grpo.rollout.v1.RolloutWorker"] {
        let answer = probe.check(status(service)).await.unwrap().into_inner();
        assert_eq!(answer.status(), ServingStatus::Serving, "{service:?}");
    }
    let mut watch = probe.watch(status("")).await.unwrap().into_inner();
    assert_eq!(watch.message().await.unwrap().unwrap().status(), ServingStatus::Serving);
    drain.send(()).unwrap();
    assert_eq!(
        watch.message().await.unwrap().unwrap().status(),
        ServingStatus::NotServing
    );
    drop(watch);
    serving.await.unwrap().unwrap();
}
