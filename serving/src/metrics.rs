//! The Prometheus registry with vLLM's metric names, written in the text
//! exposition format: gauges read from the engine at scrape time, counters
//! and latency histograms fed by [`tracked`] request streams.
//!
//! `vllm:num_requests_running` counts samples in engine slots;
//! `vllm:num_requests_waiting` counts queued requests and those held by a
//! pause; `vllm:kv_cache_usage_perc` is the fraction of slots in use;
//! `vllm:prefix_cache_*` count prompt tokens admitted and those shared from
//! a group's one prefill. `vllm:request_success` counts finished samples by
//! reason; the queue time runs from arrival until the engine took the request.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::StreamExt;
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

/// A cumulative histogram.
#[derive(Debug, Clone)]
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, value: f64) {
        for (bound, count) in self.bounds.iter().zip(&mut self.counts) {
            if value <= *bound {
                *count += 1;
            }
        }
        self.sum += value;
        self.count += 1;
    }
}

/// What the counters and histograms hold.
#[derive(Debug, Clone)]
struct Counters {
    prompt_tokens: u64,
    generation_tokens: u64,
    success: BTreeMap<&'static str, u64>,
    ttft: Histogram,
    itl: Histogram,
    e2e: Histogram,
    queue: Histogram,
}

/// The server's metrics.
#[derive(Debug)]
pub struct Metrics {
    model_name: String,
    counters: Mutex<Counters>,
}

impl Metrics {
    /// Empty metrics labelled with `model_name`.
    pub fn new(model_name: &str) -> Metrics {
        Metrics {
            model_name: model_name.to_string(),
            counters: Mutex::new(Counters {
                prompt_tokens: 0,
                generation_tokens: 0,
                success: BTreeMap::new(),
                ttft: Histogram::new(TTFT_BUCKETS),
                itl: Histogram::new(ITL_BUCKETS),
                e2e: Histogram::new(REQUEST_BUCKETS),
                queue: Histogram::new(REQUEST_BUCKETS),
            }),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Counters) -> T) -> T {
        f(&mut self.counters.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The text exposition of every metric, with the engine's `stats`.
    pub fn render(&self, stats: &ServiceStats) -> String {
        let counters = self.with(|c| c.clone());
        let engine = &stats.engine;
        let slots = engine.slots().max(1);
        let label = format!(
            "model_name=\"{}\"",
            self.model_name.replace('\\', "\\\\").replace('"', "\\\"")
        );
        let mut out = String::new();
        let mut scalar = |name: &str, kind: &str, help: &str, value: f64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{label}}} {value}"
            );
        };
        scalar(
            "vllm:num_requests_running",
            "gauge",
            "Samples running in engine slots.",
            engine.running as f64,
        );
        let waiting = (engine.waiting + stats.held_back) as f64;
        scalar("vllm:num_requests_waiting", "gauge", "Requests waiting.", waiting);
        let usage = engine.running as f64 / slots as f64;
        scalar(
            "vllm:kv_cache_usage_perc",
            "gauge",
            "Fraction of KV-cache slots in use.",
            usage,
        );
        let prompt = counters.prompt_tokens as f64;
        scalar(
            "vllm:prompt_tokens_total",
            "counter",
            "Prompt tokens processed.",
            prompt,
        );
        let generated = counters.generation_tokens as f64;
        scalar(
            "vllm:generation_tokens_total",
            "counter",
            "Tokens generated.",
            generated,
        );
        let queries = engine.prompt_tokens as f64;
        scalar(
            "vllm:prefix_cache_queries_total",
            "counter",
            "Prompt tokens admitted.",
            queries,
        );
        let hits = (engine.shared_prompt_tokens + engine.kept_prompt_tokens + engine.copied_prompt_tokens) as f64;
        scalar(
            "vllm:prefix_cache_hits_total",
            "counter",
            "Prompt tokens not computed: shared with the group's prefill, kept from the sample a request continues, or copied from a slot holding the same prefix.",
            hits,
        );
        let name = "vllm:request_success_total";
        let _ = writeln!(out, "# HELP {name} Finished samples by reason.\n# TYPE {name} counter");
        for reason in [FinishReason::Stop, FinishReason::Length, FinishReason::Abort] {
            let reason = reason.as_str();
            let count = counters.success.get(reason).copied().unwrap_or(0);
            let _ = writeln!(out, "{name}{{finished_reason=\"{reason}\",{label}}} {count}");
        }
        for (name, help, histogram) in [
            (
                "vllm:time_to_first_token_seconds",
                "Time to first token.",
                &counters.ttft,
            ),
            (
                "vllm:inter_token_latency_seconds",
                "Time between tokens.",
                &counters.itl,
            ),
            ("vllm:e2e_request_latency_seconds", "Request latency.", &counters.e2e),
            (
                "vllm:request_queue_time_seconds",
                "Time before the engine took the request.",
                &counters.queue,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
            for (bound, count) in histogram.bounds.iter().zip(&histogram.counts) {
                let _ = writeln!(out, "{name}_bucket{{le=\"{bound:?}\",{label}}} {count}");
            }
            let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\",{label}}} {}", histogram.count);
            let _ = writeln!(out, "{name}_sum{{{label}}} {}", histogram.sum);
            let _ = writeln!(out, "{name}_count{{{label}}} {}", histogram.count);
        }
        out
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
        let last = self.last_token;
        if token {
            self.last_token = Some(now);
        }
        let unfinished = &mut self.unfinished;
        let arrived = self.arrived;
        self.metrics.with(|c| {
            if token {
                c.generation_tokens += 1;
                match last {
                    None => c.ttft.observe((now - arrived).as_secs_f64()),
                    Some(last) => c.itl.observe((now - last).as_secs_f64()),
                }
            }
            if let Some(reason) = finished {
                *c.success.entry(reason.as_str()).or_default() += 1;
                *unfinished = unfinished.saturating_sub(1);
                if *unfinished == 0 {
                    c.e2e.observe((now - arrived).as_secs_f64());
                }
            }
        });
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        if self.unfinished > 0 {
            let (unfinished, arrived) = (self.unfinished, self.arrived);
            self.metrics.with(|c| {
                *c.success.entry(FinishReason::Abort.as_str()).or_default() += unfinished as u64;
                c.e2e.observe(arrived.elapsed().as_secs_f64());
            });
        }
    }
}

/// `updates` of a request of `n` samples and `prompt_tokens` that arrived
/// at `arrived` and was just taken by the engine, recorded in `metrics`.
pub fn tracked(metrics: &Arc<Metrics>, updates: Updates, arrived: Instant, prompt_tokens: usize, n: usize) -> Updates {
    metrics.with(|c| {
        c.prompt_tokens += prompt_tokens as u64;
        c.queue.observe(arrived.elapsed().as_secs_f64());
    });
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
