//! Between the engine's types and the protocol's messages, both ways (the
//! worker reads requests and writes samples; its client the reverse).
//! Unset sampling fields take [`SamplingParams::default`]'s values.

use grpo_model::lora::{LoraConfig, Targets};
use grpo_proto::rollout as proto;

use crate::error::WorkerError;
use grpo_rollout::engine::EngineStats;
use grpo_rollout::guided::Guide;
use grpo_rollout::handle::{PauseMode, ServiceStats};
use grpo_rollout::output::{Completion, FinishReason, RequestId, StopReason};
use grpo_rollout::request::{LogprobsMode, Request, SamplingParams};
use tonic::Status;

/// A count from the wire; one too large for `usize` saturates (and the engine refuses it).
fn count(value: u64) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}

/// The message asking for `request`.
pub(crate) fn request_to_proto(request: &Request) -> proto::GenerateRequest {
    let p = &request.params;
    proto::GenerateRequest {
        prompt: request.prompt.clone(),
        params: Some(proto::SamplingParams {
            n: Some(p.n as u64),
            max_tokens: Some(p.max_tokens as u64),
            min_tokens: p.min_tokens as u64,
            temperature: Some(p.temperature),
            top_k: p.top_k,
            top_p: Some(p.top_p),
            min_p: p.min_p,
            presence_penalty: p.presence_penalty,
            frequency_penalty: p.frequency_penalty,
            repetition_penalty: Some(p.repetition_penalty),
            seed: p.seed,
            stop_token_ids: p.stop_token_ids.clone(),
            stop: p.stop.clone(),
            include_stop_str_in_output: p.include_stop_str_in_output,
            ignore_eos: p.ignore_eos,
            logprobs: p.logprobs.map(|k| k as u64),
            skip_special_tokens: Some(p.skip_special_tokens),
            logprobs_mode: match p.logprobs_mode {
                LogprobsMode::Raw => proto::LogprobsMode::Raw,
                LogprobsMode::Processed => proto::LogprobsMode::Processed,
            } as i32,
            guide: p.guide.as_ref().map(guide_to_proto),
        }),
    }
}

/// The message of a guide.
fn guide_to_proto(guide: &Guide) -> proto::Guide {
    use proto::guide::Kind;
    let kind = match guide {
        Guide::JsonSchema(schema) => Kind::JsonSchema(schema.to_string()),
        Guide::JsonObject => Kind::JsonObject(true),
        Guide::Regex(pattern) => Kind::Regex(pattern.clone()),
        Guide::Choice(items) => Kind::Choice(proto::Choices { items: items.clone() }),
        Guide::Lark(grammar) => Kind::Lark(grammar.clone()),
    };
    proto::Guide { kind: Some(kind) }
}

/// The guide a message asks for; a schema that is not JSON, or a guide of
/// no kind, is refused.
fn guide_from_proto(message: proto::Guide) -> Result<Guide, Status> {
    use proto::guide::Kind;
    Ok(match message.kind {
        Some(Kind::JsonSchema(text)) => Guide::JsonSchema(
            serde_json::from_str(&text)
                .map_err(|e| Status::invalid_argument(format!("guide.json_schema is not JSON: {e}")))?,
        ),
        Some(Kind::JsonObject(_)) => Guide::JsonObject,
        Some(Kind::Regex(pattern)) => Guide::Regex(pattern),
        Some(Kind::Choice(choices)) => Guide::Choice(choices.items),
        Some(Kind::Lark(grammar)) => Guide::Lark(grammar),
        None => return Err(Status::invalid_argument("guide has no kind: set one of its fields")),
    })
}

/// The request a message asks for; a malformed guide is refused.
pub(crate) fn request_from_proto(message: proto::GenerateRequest) -> Result<Request, Status> {
    let p = message.params.unwrap_or_default();
    let d = SamplingParams::default();
    let logprobs_mode = match p.logprobs_mode() {
        proto::LogprobsMode::Raw => LogprobsMode::Raw,
        proto::LogprobsMode::Processed => LogprobsMode::Processed,
    };
    let guide = p.guide.clone().map(guide_from_proto).transpose()?;
    Ok(Request {
        prompt: message.prompt,
        params: SamplingParams {
            n: p.n.map_or(d.n, count),
            max_tokens: p.max_tokens.map_or(d.max_tokens, count),
            min_tokens: count(p.min_tokens),
            temperature: p.temperature.unwrap_or(d.temperature),
            top_k: p.top_k,
            top_p: p.top_p.unwrap_or(d.top_p),
            min_p: p.min_p,
            presence_penalty: p.presence_penalty,
            frequency_penalty: p.frequency_penalty,
            repetition_penalty: p.repetition_penalty.unwrap_or(d.repetition_penalty),
            seed: p.seed,
            stop_token_ids: p.stop_token_ids,
            stop: p.stop,
            include_stop_str_in_output: p.include_stop_str_in_output,
            ignore_eos: p.ignore_eos,
            logprobs: p.logprobs.map(count),
            skip_special_tokens: p.skip_special_tokens.unwrap_or(d.skip_special_tokens),
            logprobs_mode,
            guide,
            adapter: None,
        },
    })
}

/// The message carrying a finished sample of request `id` (top log-probs
/// only when the request asked for them).
pub(crate) fn sample_to_proto(id: RequestId, completion: Completion) -> proto::Sample {
    let finish_reason = match completion.finish_reason {
        FinishReason::Stop => proto::FinishReason::Stop,
        FinishReason::Length => proto::FinishReason::Length,
        FinishReason::Abort => proto::FinishReason::Abort,
    };
    proto::Sample {
        request_id: id,
        index: completion.index as u64,
        token_ids: completion.tokens,
        logprobs: completion.logprobs,
        versions: completion.versions,
        top_logprobs: if completion.top_logprobs.iter().all(Vec::is_empty) {
            Vec::new()
        } else {
            completion
                .top_logprobs
                .into_iter()
                .map(|top| {
                    let (token_ids, logprobs) = top.into_iter().unzip();
                    proto::TopLogprobs { token_ids, logprobs }
                })
                .collect()
        },
        text: completion.text,
        finish_reason: finish_reason.into(),
        stop_reason: completion.stop_reason.map(|reason| match reason {
            StopReason::Token(id) => proto::sample::StopReason::StopToken(id),
            StopReason::String(s) => proto::sample::StopReason::StopString(s),
        }),
    }
}

/// The finished sample a message carries.
pub(crate) fn sample_from_proto(sample: proto::Sample) -> Result<Completion, WorkerError> {
    let malformed = |message: String| WorkerError::Protocol {
        what: "sample",
        message,
    };
    let finish_reason = match proto::FinishReason::try_from(sample.finish_reason) {
        Ok(proto::FinishReason::Stop) => FinishReason::Stop,
        Ok(proto::FinishReason::Length) => FinishReason::Length,
        Ok(proto::FinishReason::Abort) => FinishReason::Abort,
        _ => return Err(malformed(format!("finish reason {}", sample.finish_reason))),
    };
    let tokens = sample.token_ids.len();
    let top_ok = sample.top_logprobs.is_empty() || sample.top_logprobs.len() == tokens;
    if sample.logprobs.len() != tokens || sample.versions.len() != tokens || !top_ok {
        return Err(malformed(format!(
            "{tokens} tokens with {} log-probs, {} versions and {} top log-prob lists",
            sample.logprobs.len(),
            sample.versions.len(),
            sample.top_logprobs.len()
        )));
    }
    let top_logprobs = if sample.top_logprobs.is_empty() {
        vec![Vec::new(); tokens]
    } else {
        sample
            .top_logprobs
            .into_iter()
            .map(|top| top.token_ids.into_iter().zip(top.logprobs).collect())
            .collect()
    };
    Ok(Completion {
        index: count(sample.index),
        tokens: sample.token_ids,
        logprobs: sample.logprobs,
        top_logprobs,
        versions: sample.versions,
        text: sample.text,
        finish_reason,
        stop_reason: sample.stop_reason.map(|reason| match reason {
            proto::sample::StopReason::StopToken(id) => StopReason::Token(id),
            proto::sample::StopReason::StopString(s) => StopReason::String(s),
        }),
    })
}

/// The protocol's name for `mode`.
pub(crate) fn pause_mode_to_proto(mode: PauseMode) -> proto::PauseMode {
    match mode {
        PauseMode::Abort => proto::PauseMode::Abort,
        PauseMode::Wait => proto::PauseMode::Wait,
        PauseMode::Keep => proto::PauseMode::Keep,
    }
}

/// The mode a message names, if it names one.
pub(crate) fn pause_mode_from_proto(code: i32) -> Option<PauseMode> {
    match proto::PauseMode::try_from(code).ok()? {
        proto::PauseMode::Abort => Some(PauseMode::Abort),
        proto::PauseMode::Wait => Some(PauseMode::Wait),
        proto::PauseMode::Keep => Some(PauseMode::Keep),
        proto::PauseMode::Unspecified => None,
    }
}

/// The message reporting `stats`.
pub(crate) fn stats_to_proto(stats: &ServiceStats) -> proto::StatsResponse {
    let e = &stats.engine;
    proto::StatsResponse {
        waiting: e.waiting as u64,
        running: e.running as u64,
        free_slots: e.free_slots as u64,
        version: e.version,
        compiled_programs: e.compiled_programs as u64,
        held_back: stats.held_back as u64,
        paused: stats.paused,
        prompt_tokens: e.prompt_tokens,
        shared_prompt_tokens: e.shared_prompt_tokens,
        generated_tokens: e.generated_tokens,
        kept_prompt_tokens: e.kept_prompt_tokens,
        copied_prompt_tokens: e.copied_prompt_tokens,
        evicted_sequences: e.evicted_sequences,
        guided_tokens: e.guided_tokens,
        guide_mask_micros: e.guide_mask_micros,
    }
}

/// The stats a message reports.
pub(crate) fn stats_from_proto(stats: proto::StatsResponse) -> ServiceStats {
    ServiceStats {
        engine: EngineStats {
            waiting: count(stats.waiting),
            running: count(stats.running),
            free_slots: count(stats.free_slots),
            version: stats.version,
            compiled_programs: count(stats.compiled_programs),
            prompt_tokens: stats.prompt_tokens,
            shared_prompt_tokens: stats.shared_prompt_tokens,
            kept_prompt_tokens: stats.kept_prompt_tokens,
            copied_prompt_tokens: stats.copied_prompt_tokens,
            evicted_sequences: stats.evicted_sequences,
            generated_tokens: stats.generated_tokens,
            guided_tokens: stats.guided_tokens,
            guide_mask_micros: stats.guide_mask_micros,
            adapters: 0,
        },
        held_back: count(stats.held_back),
        paused: stats.paused,
    }
}

/// The message describing the LoRA layout `lora`.
pub(crate) fn lora_to_proto(lora: &LoraConfig) -> proto::LoraAdapters {
    use proto::lora_adapters::Targets as Wire;
    proto::LoraAdapters {
        rank: u32::try_from(lora.rank).unwrap_or(u32::MAX),
        alpha: lora.alpha,
        use_rslora: lora.use_rslora,
        targets: Some(match &lora.targets {
            Targets::AllLinear => Wire::AllLinear(true),
            Targets::Modules(names) => Wire::Modules(proto::TargetModules { names: names.clone() }),
            Targets::Pattern(pattern) => Wire::Pattern(pattern.clone()),
        }),
    }
}

/// The LoRA layout a message describes; one without targets is refused.
pub(crate) fn lora_from_proto(message: &proto::LoraAdapters) -> Result<LoraConfig, String> {
    use proto::lora_adapters::Targets as Wire;
    let targets = match &message.targets {
        Some(Wire::AllLinear(_)) => Targets::AllLinear,
        Some(Wire::Modules(modules)) => Targets::Modules(modules.names.clone()),
        Some(Wire::Pattern(pattern)) => Targets::Pattern(pattern.clone()),
        None => return Err("the adapters name no target layers".to_string()),
    };
    Ok(LoraConfig {
        rank: message.rank as usize,
        alpha: message.alpha,
        targets,
        use_rslora: message.use_rslora,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_samples_survive_the_round_trip() {
        let request = Request {
            prompt: vec![4, 8, 15],
            params: SamplingParams {
                n: 3,
                temperature: 0.0,
                top_k: 7,
                seed: 16,
                stop_token_ids: vec![23],
                stop: vec!["42".to_string()],
                logprobs: Some(2),
                skip_special_tokens: false,
                logprobs_mode: LogprobsMode::Processed,
                ..SamplingParams::default()
            },
        };
        assert_eq!(request_from_proto(request_to_proto(&request)).unwrap(), request);
        let schema = serde_json::json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        for guide in [
            Guide::JsonSchema(schema),
            Guide::JsonObject,
            Guide::Regex("[0-9]+".to_string()),
            Guide::Choice(vec!["yes".to_string(), "no".to_string()]),
            Guide::Lark("start: \"a\"+".to_string()),
        ] {
            let guided = Request {
                prompt: vec![1],
                params: SamplingParams {
                    guide: Some(guide),
                    ..SamplingParams::default()
                },
            };
            assert_eq!(request_from_proto(request_to_proto(&guided)).unwrap(), guided);
        }
        let completion = Completion {
            index: 2,
            tokens: vec![1, 2],
            logprobs: vec![-0.5, -1.5],
            top_logprobs: vec![vec![(1, -0.5), (9, -0.7)], vec![(3, -1.0), (2, -1.5)]],
            versions: vec![0, 1],
            text: Some("ab".to_string()),
            finish_reason: FinishReason::Stop,
            stop_reason: Some(StopReason::Token(2)),
        };
        let message = sample_to_proto(11, completion.clone());
        assert_eq!(message.request_id, 11);
        assert_eq!(sample_from_proto(message).unwrap(), completion);
    }

    #[test]
    fn unset_fields_take_the_engine_defaults() {
        let empty = proto::GenerateRequest {
            prompt: vec![1],
            params: None,
        };
        assert_eq!(request_from_proto(empty).unwrap().params, SamplingParams::default());
    }

    #[test]
    fn malformed_guides_are_refused() {
        let with_guide = |kind| proto::GenerateRequest {
            prompt: vec![1],
            params: Some(proto::SamplingParams {
                guide: Some(proto::Guide { kind }),
                ..Default::default()
            }),
        };
        let not_json = request_from_proto(with_guide(Some(proto::guide::Kind::JsonSchema("{".to_string()))));
        assert!(
            not_json
                .unwrap_err()
                .message()
                .contains("guide.json_schema is not JSON")
        );
        let no_kind = request_from_proto(with_guide(None));
        assert!(no_kind.unwrap_err().message().contains("guide has no kind"));
    }

    #[test]
    fn malformed_samples_are_refused() {
        let good = sample_to_proto(
            0,
            Completion {
                index: 0,
                tokens: vec![1],
                logprobs: vec![-1.0],
                top_logprobs: vec![Vec::new()],
                versions: vec![0],
                text: None,
                finish_reason: FinishReason::Length,
                stop_reason: None,
            },
        );
        assert!(sample_from_proto(good.clone()).is_ok());
        let mut unknown = good.clone();
        unknown.finish_reason = 0;
        let mut short = good;
        short.versions.clear();
        for bad in [unknown, short] {
            assert!(matches!(sample_from_proto(bad), Err(WorkerError::Protocol { .. })));
        }
    }

    #[test]
    fn lora_layouts_survive_the_round_trip_and_one_without_targets_is_refused() {
        for targets in [
            Targets::AllLinear,
            Targets::Modules(vec!["q_proj".into(), "model.layers.0.mlp.down_proj".into()]),
            Targets::Pattern(".*_proj".into()),
        ] {
            let lora = LoraConfig {
                rank: 16,
                alpha: 32.0,
                targets,
                use_rslora: true,
            };
            assert_eq!(lora_from_proto(&lora_to_proto(&lora)).unwrap(), lora);
        }
        let mut message = lora_to_proto(&LoraConfig {
            rank: 1,
            alpha: 1.0,
            targets: Targets::AllLinear,
            use_rslora: false,
        });
        message.targets = None;
        assert!(lora_from_proto(&message).unwrap_err().contains("target"));
    }
}
