//! The engine behind its async handle: concurrent requests get the tokens
//! the engine gives them directly, a dropped stream aborts its request,
//! pausing keeps, drains or aborts what the engine holds, and weight
//! updates land between steps.

mod common;

use common::{cpu_client, fixture};
use grpo_model::config::ModelConfig;
use grpo_rollout::engine::{Engine, InFlight};
use grpo_rollout::handle::{EngineHandle, PauseMode, SampleStream};
use grpo_rollout::output::{Completion, FinishReason};
use grpo_rollout::request::{Request, SamplingParams};
use grpo_xla::Client;

fn engine(client: &Client) -> Engine {
    common::engine(client, fixture("llama").to_str().unwrap(), 4, 64)
}

fn request(seed: u32, n: usize, max_tokens: usize) -> Request {
    Request {
        prompt: vec![11, 5, 90, 3],
        params: SamplingParams {
            n,
            max_tokens,
            seed,
            ignore_eos: true,
            ..SamplingParams::default()
        },
    }
}

/// Every sample of a stream, by index, once it ends.
async fn collect(stream: SampleStream) -> Vec<Completion> {
    stream.finished().await.unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn concurrent_requests_match_the_engine_run_directly() {
    let client = cpu_client();
    let requests = [request(1, 1, 7), request(2, 3, 5), request(3, 2, 9)];
    let want = engine(&client).generate(&requests).unwrap();
    let handle = EngineHandle::spawn(engine(&client));
    let got = runtime().block_on(async {
        let streams = futures_join(&handle, &requests).await;
        let mut all = Vec::new();
        for stream in streams {
            all.push(collect(stream).await);
        }
        all
    });
    for (got, want) in got.iter().zip(&want) {
        let tokens = |c: &[Completion]| c.iter().map(|s| s.tokens.clone()).collect::<Vec<_>>();
        assert_eq!(tokens(got), tokens(want));
    }
}

async fn futures_join(handle: &EngineHandle, requests: &[Request]) -> Vec<SampleStream> {
    let mut streams = Vec::new();
    for r in requests {
        streams.push(handle.generate(r.clone()).await.unwrap());
    }
    streams
}

#[test]
fn dropping_a_stream_aborts_and_pauses_keep_drain_or_abort() {
    let client = cpu_client();
    let handle = EngineHandle::spawn(engine(&client));
    runtime().block_on(async {
        // A dropped stream frees its slots.
        let mut stream = handle.generate(request(5, 2, 60)).await.unwrap();
        stream.next().await.unwrap().unwrap();
        drop(stream);
        let stats = loop {
            let stats = handle.stats().await.unwrap();
            if stats.engine.running == 0 {
                break stats;
            }
        };
        assert_eq!(stats.engine.free_slots, 4);

        // Keep: nothing moves while paused; new requests wait for resume.
        let mut kept = handle.generate(request(6, 1, 30)).await.unwrap();
        kept.next().await.unwrap().unwrap();
        handle.pause(PauseMode::Keep).await.unwrap();
        let frozen = handle.stats().await.unwrap();
        assert!(frozen.paused && frozen.engine.running == 1);
        let late = {
            let handle = handle.clone();
            tokio::spawn(async move { collect(handle.generate(request(7, 1, 3)).await.unwrap()).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let still = handle.stats().await.unwrap();
        assert_eq!((still.engine.running, still.held_back), (1, 1), "frozen while paused");
        handle.resume().await.unwrap();
        assert_eq!(collect(kept).await[0].tokens.len(), 30);
        assert_eq!(late.await.unwrap()[0].tokens.len(), 3);

        // Wait: returns once what the engine holds has finished.
        let waited = handle.generate(request(8, 2, 12)).await.unwrap();
        handle.pause(PauseMode::Wait).await.unwrap();
        let stats = handle.stats().await.unwrap();
        assert_eq!((stats.engine.running, stats.engine.waiting), (0, 0));
        let done = collect(waited).await;
        assert!(
            done.iter()
                .all(|c| c.finish_reason == FinishReason::Length && c.tokens.len() == 12)
        );
        handle.resume().await.unwrap();

        // Held back by a pause: a caller that gives up is dropped on resume;
        // a later Pause(Abort) aborts the others.
        handle.pause(PauseMode::Keep).await.unwrap();
        let gone = {
            let handle = handle.clone();
            tokio::spawn(async move { handle.generate(request(10, 1, 5)).await.map(|s| s.id) })
        };
        let waiting = {
            let handle = handle.clone();
            tokio::spawn(async move { collect(handle.generate(request(11, 2, 50)).await.unwrap()).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        gone.abort();
        assert!(gone.await.is_err(), "the caller gave up");
        handle.pause(PauseMode::Abort).await.unwrap();
        let ended = waiting.await.unwrap();
        assert!(ended.len() == 2 && ended.iter().all(|c| c.finish_reason == FinishReason::Abort));
        handle.resume().await.unwrap();
        let idle = handle.stats().await.unwrap();
        assert_eq!((idle.engine.running, idle.engine.waiting, idle.held_back), (0, 0, 0));

        // Abort: running samples end now with what they drew.
        let mut aborted = handle.generate(request(9, 1, 60)).await.unwrap();
        aborted.next().await.unwrap().unwrap();
        handle.pause(PauseMode::Abort).await.unwrap();
        let done = collect(aborted).await;
        assert_eq!(done[0].finish_reason, FinishReason::Abort);
        assert!(done[0].tokens.len() < 60);
        handle.resume().await.unwrap();
    });
}

fn update_tensor() -> grpo_model::weights::HostTensor {
    grpo_model::weights::HostTensor::new(vec![1], vec![0.0]).unwrap()
}

#[test]
fn weight_updates_through_the_handle_land_between_steps() {
    let client = cpu_client();
    let handle = EngineHandle::spawn(engine(&client));
    let config = ModelConfig::from_file(fixture("llama").join("config.json")).unwrap();
    let update: Vec<_> = grpo_model::init::random_weights(&config, 3)
        .unwrap()
        .into_iter()
        .collect();
    runtime().block_on(async {
        let mut stream = handle.generate(request(4, 1, 20)).await.unwrap();
        stream.next().await.unwrap().unwrap();
        handle.update_weights(1, update, InFlight::Keep).await.unwrap();
        let done = collect(stream).await;
        let versions = &done[0].versions;
        assert_eq!(versions[0], 0);
        assert_eq!(*versions.last().unwrap(), 1);
        assert!(versions.windows(2).all(|w| w[0] <= w[1]), "{versions:?}");
        assert_eq!(handle.stats().await.unwrap().engine.version, 1);
        let unknown = vec![("lm_head.bias".to_string(), update_tensor())];
        let refused = handle.update_weights(2, unknown, InFlight::Keep).await;
        assert!(matches!(
            refused,
            Err(grpo_rollout::Error::InvalidUpdate { version: 2, .. })
        ));
        assert_eq!(handle.stats().await.unwrap().engine.version, 1);
    });
}
