//! The rollout engine's gauges and counters at scrape time, under vLLM's
//! names where vLLM has one, else under `grpo_engine_`.
//!
//! - `vllm:num_requests_running`: samples in engine slots.
//! - `vllm:num_requests_waiting`: queued requests, and those a pause holds.
//! - `vllm:kv_cache_usage_perc`: the fraction of slots in use.
//! - `vllm:prefix_cache_queries_total`: prompt tokens admitted.
//! - `vllm:prefix_cache_hits_total`: of those, the ones shared from a group's
//!   one prefill, kept from the sample a request continues, or copied from a
//!   slot holding the same prefix.
//! - Beside them: the weights' version, whether the engine is paused, tokens
//!   generated and guided, programs compiled and LoRA adapters loaded.

use grpo_rollout::handle::ServiceStats;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

/// Registers the engine's values in `stats` into `registry`, a registry
/// made for one scrape.
pub fn register(registry: &mut Registry, stats: &ServiceStats) {
    let engine = &stats.engine;
    let gauge = |registry: &mut Registry, name: &str, help: &str, value: f64| {
        registry.register(name, help, ConstGauge::new(value));
    };
    let counter = |registry: &mut Registry, name: &str, help: &str, value: u64| {
        registry.register(name, help, ConstCounter::new(value));
    };
    let waiting = engine.waiting + stats.held_back;
    let usage = engine.running as f64 / engine.slots().max(1) as f64;
    let hits = engine.shared_prompt_tokens + engine.kept_prompt_tokens + engine.copied_prompt_tokens;
    gauge(
        registry,
        "vllm:num_requests_running",
        "Samples running in engine slots",
        engine.running as f64,
    );
    gauge(
        registry,
        "vllm:num_requests_waiting",
        "Requests waiting, queued or held by a pause",
        waiting as f64,
    );
    gauge(
        registry,
        "vllm:kv_cache_usage_perc",
        "Fraction of KV-cache slots in use",
        usage,
    );
    counter(
        registry,
        "vllm:prefix_cache_queries",
        "Prompt tokens admitted",
        engine.prompt_tokens,
    );
    counter(
        registry,
        "vllm:prefix_cache_hits",
        "Prompt tokens not computed: shared with the group's prefill, kept from the sample a request continues, or copied from a slot holding the same prefix",
        hits,
    );
    gauge(
        registry,
        "grpo_engine_weights_version",
        "Policy version of the engine's weights",
        engine.version as f64,
    );
    gauge(
        registry,
        "grpo_engine_paused",
        "1 while generation is paused",
        f64::from(u8::from(stats.paused)),
    );
    gauge(
        registry,
        "grpo_engine_slots",
        "Engine slots (max_num_seqs)",
        engine.slots() as f64,
    );
    counter(
        registry,
        "grpo_engine_generated_tokens",
        "Tokens the engine generated",
        engine.generated_tokens,
    );
    counter(
        registry,
        "grpo_engine_guided_tokens",
        "Generated tokens drawn under a guide's mask",
        engine.guided_tokens,
    );
    gauge(
        registry,
        "grpo_engine_compiled_programs",
        "Engine programs compiled so far",
        engine.compiled_programs as f64,
    );
    gauge(
        registry,
        "grpo_engine_lora_adapters",
        "LoRA adapters loaded into the engine",
        engine.adapters as f64,
    );
}
