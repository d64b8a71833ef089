//! vLLM's request metrics on a Prometheus registry: counters and latency
//! histograms fed by [`tracked`] request streams, rendered with the engine's
//! gauges read at scrape time ([`grpo_metrics::engine`]). Every series
//! carries the `model_name` label.
//!
//! `vllm:request_success_total` counts finished samples by reason; the
//! queue time runs from arrival until the engine took the request.

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use grpo_metrics::prometheus_client::metrics::counter::Counter;
use grpo_metrics::prometheus_client::metrics::family::Family;
use grpo_metrics::prometheus_client::metrics::histogram::Histogram;
use grpo_metrics::prometheus_client::registry::Registry;
use grpo_rollout::handle::ServiceStats;
use grpo_rollout::output::FinishReason;

use crate::backend::Updates;

/// Bucket bounds (seconds) of vLLM's time-to-first-token histogram.
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
];
/// Bucket bounds (seconds) of vLLM's inter-token latency histogram.
const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
];
/// Bucket bounds (seconds) of vLLM's request latency histograms.
const REQUEST_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
];

/// The label of a finished sample's reason.
type Reason = [(&'static str, &'static str); 1];

/// The server's metrics.
#[derive(Debug)]
pub struct Metrics {
    model_name: String,
    registry: Registry,
    prompt_tokens: Counter,
    generation_tokens: Counter,
    success: Family<Reason, Counter>,
    ttft: Histogram,
    itl: Histogram,
    e2e: Histogram,
    queue: Histogram,
}

impl Metrics {
    /// Empty metrics labelled with `model_name`.
    pub fn new(model_name: &str) -> Metrics {
        let mut registry = grpo_metrics::labelled("model_name", model_name);
        let prompt_tokens = Counter::default();
        let generation_tokens = Counter::default();
        let success = Family::<Reason, Counter>::default();
        for reason in [FinishReason::Stop, FinishReason::Length, FinishReason::Abort] {
            let _ = success.get_or_create(&[("finished_reason", reason.as_str())]);
        }
        let [ttft, itl, e2e, queue] = [TTFT_BUCKETS, ITL_BUCKETS, REQUEST_BUCKETS, REQUEST_BUCKETS]
            .map(|bounds| Histogram::new(bounds.iter().copied()));
        registry.register("vllm:prompt_tokens", "Prompt tokens processed", prompt_tokens.clone());
        registry.register("vllm:generation_tokens", "Tokens generated", generation_tokens.clone());
        registry.register("vllm:request_success", "Finished samples by reason", success.clone());
        registry.register("vllm:time_to_first_token_seconds", "Time to first token", ttft.clone());
        registry.register("vllm:inter_token_latency_seconds", "Time between tokens", itl.clone());
        registry.register("vllm:e2e_request_latency_seconds", "Request latency", e2e.clone());
        registry.register(
            "vllm:request_queue_time_seconds",
            "Time before the engine took the request",
            queue.clone(),
        );
        Metrics {
            model_name: model_name.to_string(),
            registry,
            prompt_tokens,
            generation_tokens,
            success,
            ttft,
            itl,
            e2e,
            queue,
        }
    }

    /// The page of every metric, with the engine's `stats`.
    pub fn render(&self, stats: &ServiceStats) -> String {
        let mut engine = grpo_metrics::labelled("model_name", &self.model_name);
        grpo_metrics::engine::register(&mut engine, stats);
        grpo_metrics::render(&[&engine, &self.registry])
    }

    /// Counts `n` finished samples of `reason`.
    fn finished(&self, reason: FinishReason, n: u64) {
        self.success
            .get_or_create(&[("finished_reason", reason.as_str())])
            .inc_by(n);
    }
}

/// One request's timings, recorded as its updates pass; a request dropped
/// before its samples finished counts them as aborted.
struct Tracker {
    metrics: Arc<Metrics>,
    arrived: Instant,
    last_token: Option<Instant>,
    unfinished: usize,
}

impl Tracker {
    fn update(&mut self, token: bool, finished: Option<FinishReason>) {
        let now = Instant::now();
        let metrics = &self.metrics;
        if token {
            metrics.generation_tokens.inc();
            match self.last_token {
                None => metrics.ttft.observe((now - self.arrived).as_secs_f64()),
                Some(last) => metrics.itl.observe((now - last).as_secs_f64()),
            }
            self.last_token = Some(now);
        }
        if let Some(reason) = finished {
            metrics.finished(reason, 1);
            self.unfinished = self.unfinished.saturating_sub(1);
            if self.unfinished == 0 {
                metrics.e2e.observe((now - self.arrived).as_secs_f64());
            }
        }
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        if self.unfinished > 0 {
            self.metrics.finished(FinishReason::Abort, self.unfinished as u64);
            self.metrics.e2e.observe(self.arrived.elapsed().as_secs_f64());
        }
    }
}

/// `updates` of a request of `n` samples and `prompt_tokens` that arrived
/// at `arrived` and was just taken by the engine, recorded in `metrics`.
pub fn tracked(metrics: &Arc<Metrics>, updates: Updates, arrived: Instant, prompt_tokens: usize, n: usize) -> Updates {
    metrics.prompt_tokens.inc_by(prompt_tokens as u64);
    metrics.queue.observe(arrived.elapsed().as_secs_f64());
    let mut tracker = Tracker {
        metrics: metrics.clone(),
        arrived,
        last_token: None,
        unfinished: n,
    };
    Box::pin(updates.inspect(move |update| {
        if let Ok(update) = update {
            tracker.update(
                update.token.is_some(),
                update.finished.as_ref().map(|c| c.finish_reason),
            );
        }
    }))
}
