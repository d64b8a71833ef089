//! `[logging] prometheus_listen`: the run's Prometheus page at
//! `http://ADDR/metrics`, served on a thread of its own and updated after
//! each step (of `grpo run` and `grpo sft` alike):
//!
//! - `grpo_step` and `grpo_max_steps`: steps done, and the run's last;
//! - `grpo_reward` and `grpo_reward_std`: the last step's mean reward and
//!   its spread;
//! - `grpo_tokens_total`, `grpo_tokens_per_second`: prompt and completion
//!   tokens of the samples trained on (TRL's `num_tokens` counts the same),
//!   and the last step's over its time;
//! - `grpo_step_duration_seconds`: a histogram of step times;
//! - `grpo_weight_syncs_total`, `grpo_weight_sync_bytes_total`,
//!   `grpo_weight_sync_seconds_total`: weight pushes to the engines;
//! - `grpo_fleet_members` and `grpo_fleet_ready_workers`: the fleet at the
//!   last step;
//! - `grpo_train_metric{name}`: every numeric metric of the last step that
//!   had it, under its `metrics.jsonl` name (`loss`, `kl`, `eval_accuracy`, …).
//!
//! Counters count this process's steps: a resumed run starts them at zero,
//! as Prometheus expects of a restarted target.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use grpo_metrics::endpoint::{Endpoint, registry_page};
use grpo_metrics::prometheus_client::metrics::counter::Counter;
use grpo_metrics::prometheus_client::metrics::family::Family;
use grpo_metrics::prometheus_client::metrics::gauge::Gauge;
use grpo_metrics::prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use grpo_metrics::prometheus_client::registry::Registry;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::hooks::{Hook, RunContext};
use crate::trainer::StepRecord;

/// A gauge of real values.
type RealGauge = Gauge<f64, AtomicU64>;

/// The label of a step metric's name.
type Name = [(&'static str, String); 1];

/// The run's metrics.
struct RunMetrics {
    step: Gauge,
    max_steps: Gauge,
    reward: RealGauge,
    reward_std: RealGauge,
    tokens: Counter,
    tokens_per_second: RealGauge,
    step_seconds: Histogram,
    syncs: Counter,
    sync_bytes: Counter,
    sync_seconds: Counter<f64, AtomicU64>,
    fleet_members: Gauge,
    fleet_ready: Gauge,
    last: Family<Name, RealGauge>,
}

impl RunMetrics {
    fn new() -> RunMetrics {
        RunMetrics {
            step: Gauge::default(),
            max_steps: Gauge::default(),
            reward: RealGauge::default(),
            reward_std: RealGauge::default(),
            tokens: Counter::default(),
            tokens_per_second: RealGauge::default(),
            // 0.5 s to about 4.5 hours.
            step_seconds: Histogram::new(exponential_buckets(0.5, 2.0, 16)),
            syncs: Counter::default(),
            sync_bytes: Counter::default(),
            sync_seconds: Counter::default(),
            fleet_members: Gauge::default(),
            fleet_ready: Gauge::default(),
            last: Family::default(),
        }
    }

    /// Registers every metric in `registry`.
    fn register(&self, registry: &mut Registry) {
        let m = self;
        registry.register("grpo_step", "Steps done", m.step.clone());
        registry.register("grpo_max_steps", "The run's last step", m.max_steps.clone());
        registry.register("grpo_reward", "The last step's mean reward", m.reward.clone());
        registry.register(
            "grpo_reward_std",
            "The last step's reward standard deviation",
            m.reward_std.clone(),
        );
        registry.register(
            "grpo_tokens",
            "Prompt and completion tokens of the samples trained on",
            m.tokens.clone(),
        );
        registry.register(
            "grpo_tokens_per_second",
            "The last step's prompt and completion tokens over its time",
            m.tokens_per_second.clone(),
        );
        registry.register("grpo_step_duration_seconds", "Step times", m.step_seconds.clone());
        registry.register("grpo_weight_syncs", "Weight pushes to the engines", m.syncs.clone());
        registry.register("grpo_weight_sync_bytes", "Bytes of weight pushes", m.sync_bytes.clone());
        registry.register(
            "grpo_weight_sync_seconds",
            "Time spent pushing weights",
            m.sync_seconds.clone(),
        );
        registry.register(
            "grpo_fleet_members",
            "Rollout engines in the fleet",
            m.fleet_members.clone(),
        );
        registry.register(
            "grpo_fleet_ready_workers",
            "Fleet members ready to sample",
            m.fleet_ready.clone(),
        );
        registry.register(
            "grpo_train_metric",
            "Each numeric metric of the last step that had it, by its metrics.jsonl name",
            m.last.clone(),
        );
    }

    /// Takes in a step's record.
    fn record(&self, record: &StepRecord) {
        let number = |name: &str| record.metrics.get(name).and_then(Value::as_f64);
        for (name, value) in &record.metrics {
            if let Some(value) = value.as_f64() {
                self.last.get_or_create(&[("name", name.clone())]).set(value);
            }
        }
        if record.step == 0 {
            return;
        }
        self.step.set(record.step as i64);
        if let Some(reward) = number("reward") {
            self.reward.set(reward);
        }
        if let Some(std) = number("reward_std") {
            self.reward_std.set(std);
        }
        self.tokens.inc_by(record.input_tokens as u64);
        if let Some(seconds) = number("step_time") {
            self.step_seconds.observe(seconds);
            if seconds > 0.0 {
                self.tokens_per_second.set(record.input_tokens as f64 / seconds);
            }
        }
        if let (Some(bytes), Some(seconds)) = (number("weight_sync_bytes"), number("time_weight_sync")) {
            self.syncs.inc();
            self.sync_bytes.inc_by(bytes as u64);
            self.sync_seconds.inc_by(seconds);
        }
        if let Some(members) = number("fleet_members") {
            self.fleet_members.set(members as i64);
        }
        if let Some(ready) = number("fleet_ready") {
            self.fleet_ready.set(ready as i64);
        }
    }
}

/// The hook serving the page at `addr` from the run's start.
pub struct Exporter {
    addr: SocketAddr,
    metrics: RunMetrics,
    /// The page: `metrics`, registered.
    registry: Arc<Registry>,
    endpoint: Option<Endpoint>,
}

impl Exporter {
    /// An exporter to listen on `addr` (port 0 picks a free one).
    pub fn new(addr: SocketAddr) -> Exporter {
        let metrics = RunMetrics::new();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        Exporter {
            addr,
            metrics,
            registry: Arc::new(registry),
            endpoint: None,
        }
    }
}

impl Hook for Exporter {
    fn on_start(&mut self, run: &mut dyn RunContext) -> Result<()> {
        self.metrics.max_steps.set(run.max_steps() as i64);
        self.metrics.step.set(run.steps_done() as i64);
        let page = registry_page(Arc::clone(&self.registry));
        let endpoint = Endpoint::start(self.addr, page).map_err(|e| Error::Config {
            field: "logging.prometheus_listen",
            message: format!("cannot listen on {}: {e}", self.addr),
        })?;
        tracing::info!("Prometheus metrics at http://{}/metrics", endpoint.addr());
        self.endpoint = Some(endpoint);
        Ok(())
    }

    fn on_step(&mut self, _: &mut dyn RunContext, record: &mut StepRecord) -> Result<()> {
        self.metrics.record(record);
        Ok(())
    }
}
