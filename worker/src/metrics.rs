//! What a worker counts beyond its engine's gauges, for its `/metrics`
//! page (`grpo worker --metrics-port`):
//!
//! - `grpo_worker_weight_updates_total{outcome}`: updates finished,
//!   `installed` or `rejected` (a bad chunk, a wrong version, a refused
//!   layout);
//! - `grpo_worker_weight_update_bytes_total`: chunk bytes received;
//! - `grpo_worker_weight_update_seconds`: an installed update's time from
//!   its start to the engine's swap;
//! - `grpo_worker_generate_calls_total` and `grpo_worker_samples_sent_total`.

use grpo_metrics::endpoint::Page;
use grpo_metrics::prometheus_client::metrics::counter::Counter;
use grpo_metrics::prometheus_client::metrics::family::Family;
use grpo_metrics::prometheus_client::metrics::histogram::Histogram;
use grpo_metrics::prometheus_client::registry::Registry;
use grpo_rollout::handle::EngineHandle;
use std::sync::Arc;

/// Bucket bounds (seconds) of the weight update time.
const UPDATE_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// The label of an update's outcome.
type Outcome = [(&'static str, &'static str); 1];

/// The worker's counters.
#[derive(Debug)]
pub(crate) struct WorkerMetrics {
    registry: Registry,
    updates: Family<Outcome, Counter>,
    /// Chunk bytes received.
    pub(crate) update_bytes: Counter,
    /// Installed updates' time from start to swap.
    pub(crate) update_seconds: Histogram,
    /// Generate calls taken.
    pub(crate) generate_calls: Counter,
    /// Finished samples sent to callers.
    pub(crate) samples_sent: Counter,
}

impl WorkerMetrics {
    /// Zeroed counters.
    pub(crate) fn new() -> WorkerMetrics {
        let mut registry = Registry::default();
        let updates = Family::<Outcome, Counter>::default();
        for outcome in ["installed", "rejected"] {
            let _ = updates.get_or_create(&[("outcome", outcome)]);
        }
        let update_bytes = Counter::default();
        let update_seconds = Histogram::new(UPDATE_BUCKETS.iter().copied());
        let generate_calls = Counter::default();
        let samples_sent = Counter::default();
        registry.register(
            "grpo_worker_weight_updates",
            "Weight updates finished, by outcome",
            updates.clone(),
        );
        registry.register(
            "grpo_worker_weight_update_bytes",
            "Weight chunk bytes received",
            update_bytes.clone(),
        );
        registry.register(
            "grpo_worker_weight_update_seconds",
            "Installed weight updates' time from start to swap",
            update_seconds.clone(),
        );
        registry.register(
            "grpo_worker_generate_calls",
            "Generate calls taken",
            generate_calls.clone(),
        );
        registry.register(
            "grpo_worker_samples_sent",
            "Finished samples sent to callers",
            samples_sent.clone(),
        );
        WorkerMetrics {
            registry,
            updates,
            update_bytes,
            update_seconds,
            generate_calls,
            samples_sent,
        }
    }

    /// Counts a finished update: installed, or not.
    pub(crate) fn update_finished(&self, installed: bool) {
        let outcome = if installed { "installed" } else { "rejected" };
        self.updates.get_or_create(&[("outcome", outcome)]).inc();
    }
}

/// The page of `metrics` and the engine behind `handle`, read at each
/// scrape; a stopped engine has none.
pub(crate) fn page(metrics: Arc<WorkerMetrics>, handle: EngineHandle) -> Page {
    Arc::new(move || {
        let (metrics, handle) = (metrics.clone(), handle.clone());
        Box::pin(async move {
            let stats = handle
                .stats()
                .await
                .map_err(|e| format!("the engine does not answer: {e}"))?;
            let mut engine = Registry::default();
            grpo_metrics::engine::register(&mut engine, &stats);
            Ok(grpo_metrics::render(&[&engine, &metrics.registry]))
        })
    })
}
