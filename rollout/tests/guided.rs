//! Guided decoding in the engine, on a tiny random llama over SmolLM2's
//! tokenizer (49,152 tokens, after `grpo setup`): whatever the random model
//! prefers, every guided sample that ends on its own is text of its grammar
//! (a bounded JSON schema, checked field by field; a regex; a choice);
//! unguided rows beside guided ones draw what they draw alone; the
//! log-probs recorded for guided tokens are the unmasked model's, as the
//! log-prob program scores them; and guides the engine cannot serve are
//! refused by name.

mod common;

use common::{cpu_client, smollm2_tokenizer};
use grpo_model::config::{Family, ModelConfig};
use grpo_model::decoder::Decoder;
use grpo_model::init::{Preset, preset_config, random_weights};
use grpo_model::load::upload_parameters;
use grpo_model::logprobs::LogprobsRunner;
use grpo_model::weights::{Safetensors, save_safetensors};
use grpo_rollout::Error;
use grpo_rollout::engine::{Engine, EngineConfig};
use grpo_rollout::guided::Guide;
use grpo_rollout::output::{Completion, FinishReason};
use grpo_rollout::request::{LogprobsMode, Request, SamplingParams};
use grpo_xla::{Buffer, Client, ElementType};
use serde_json::{Value, json};

/// The model's EOS (SmolLM2's `<|im_end|>`).
const EOS: u32 = 2;

/// A tiny random llama over SmolLM2's vocabulary, its parameters on the device.
fn model(client: &Client) -> (Decoder, Vec<Buffer>) {
    let config: ModelConfig = preset_config(Family::Llama, Preset::Tiny, smollm2_tokenizer().vocab_size(), None, EOS);
    let decoder = Decoder::new(config.clone());
    let dir = tempfile::tempdir().unwrap();
    save_safetensors(
        dir.path().join("model.safetensors"),
        &random_weights(&config, 11).unwrap(),
    )
    .unwrap();
    let weights = Safetensors::open_dir(dir.path()).unwrap();
    let params = upload_parameters(client, client.device(0).unwrap(), &decoder, &weights, ElementType::F32).unwrap();
    (decoder, params)
}

fn engine(client: &Client, slots: usize) -> Engine {
    let (decoder, params) = model(client);
    let config = EngineConfig {
        max_num_seqs: slots,
        max_model_len: 256,
        ..EngineConfig::default()
    };
    Engine::new(client, decoder, params, config)
        .unwrap()
        .with_tokenizer(smollm2_tokenizer())
}

fn prompt() -> Vec<u32> {
    smollm2_tokenizer()
        .encode("Answer in the format asked:", false)
        .unwrap()
}

fn guided(guide: Guide, n: usize, seed: u32, max_tokens: usize) -> Request {
    Request {
        prompt: prompt(),
        params: SamplingParams {
            n,
            max_tokens,
            seed,
            guide: Some(guide),
            ..SamplingParams::default()
        },
    }
}

/// The completions of `request`, checking that each ended on its own or at `max_tokens`.
fn completions(engine: &mut Engine, request: Request) -> Vec<Completion> {
    let max_tokens = request.params.max_tokens;
    let done = engine.generate(&[request]).unwrap().remove(0);
    for c in &done {
        match c.finish_reason {
            FinishReason::Stop => assert_eq!(c.tokens.last(), Some(&EOS), "a guided sample ends with EOS"),
            FinishReason::Length => assert_eq!(c.tokens.len(), max_tokens),
            FinishReason::Abort => panic!("a guided sample was aborted: {c:?}"),
        }
    }
    done
}

/// The text of a finished sample (EOS, a special token, left out).
fn text(c: &Completion) -> String {
    c.text.clone().expect("the engine has a tokenizer")
}

#[test]
fn guided_samples_are_text_of_their_grammar() {
    let client = cpu_client();
    let mut engine = engine(&client, 8);
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "mood": {"enum": ["happy", "sad"]}
        },
        "required": ["name", "age", "mood"],
        "additionalProperties": false
    });
    let mut stopped = 0;
    for seed in 0..4 {
        for c in completions(&mut engine, guided(Guide::JsonSchema(schema.clone()), 8, seed, 40)) {
            if c.finish_reason != FinishReason::Stop {
                continue;
            }
            stopped += 1;
            let text = text(&c);
            let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?} is not JSON: {e}"));
            let object = value.as_object().unwrap_or_else(|| panic!("{text:?} is not an object"));
            assert_eq!(object.len(), 3, "{text:?}");
            assert!(
                object["name"].as_str().is_some_and(|n| n.chars().count() <= 6),
                "{text:?}"
            );
            assert!(
                object["age"].as_i64().is_some_and(|a| (0..=120).contains(&a)),
                "{text:?}"
            );
            assert!(matches!(object["mood"].as_str(), Some("happy" | "sad")), "{text:?}");
        }
    }
    assert!(stopped >= 16, "only {stopped} of 32 samples ended on their own");

    let pattern = regex::Regex::new(r"^[0-9]{3}-[a-z]{2}$").unwrap();
    let choices = ["red", "green", "deep blue"];
    for c in completions(&mut engine, guided(Guide::Regex("[0-9]{3}-[a-z]{2}".into()), 8, 5, 20)) {
        assert_eq!(c.finish_reason, FinishReason::Stop, "the regex bounds the text");
        assert!(pattern.is_match(&text(&c)), "{:?}", text(&c));
    }
    let choice = Guide::Choice(choices.iter().map(|c| c.to_string()).collect());
    for c in completions(&mut engine, guided(choice, 8, 6, 20)) {
        assert_eq!(c.finish_reason, FinishReason::Stop);
        assert!(choices.contains(&text(&c).as_str()), "{:?}", text(&c));
    }
    let lark = Guide::Lark("start: \"(\" NUMBER (\"+\" NUMBER)* \")\"\nNUMBER: /[1-9][0-9]?/".into());
    for c in completions(&mut engine, guided(lark, 8, 7, 30)) {
        if c.finish_reason == FinishReason::Stop {
            let text = text(&c);
            let inner = text.strip_prefix('(').and_then(|t| t.strip_suffix(')')).unwrap();
            assert!(
                inner
                    .split('+')
                    .all(|n| n.parse::<u32>().is_ok_and(|n| (1..100).contains(&n))),
                "{text:?}"
            );
        }
    }
    let stats = engine.stats();
    assert!(stats.guided_tokens > 0 && stats.guided_tokens <= stats.generated_tokens);
}

#[test]
fn unguided_rows_draw_the_same_beside_guided_ones() {
    let client = cpu_client();
    let mut engine = engine(&client, 4);
    let plain = |seed| Request {
        prompt: prompt(),
        params: SamplingParams {
            n: 2,
            max_tokens: 24,
            seed,
            ignore_eos: true,
            ..SamplingParams::default()
        },
    };
    // Alone, then beside a guided request in the same batch shape.
    let alone = engine.generate(&[plain(3), plain(4)]).unwrap();
    let schema = json!({"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]});
    let mixed = engine
        .generate(&[plain(3), guided(Guide::JsonSchema(schema), 2, 9, 24)])
        .unwrap();
    for (a, m) in alone[0].iter().zip(&mixed[0]) {
        assert_eq!(
            a.tokens, m.tokens,
            "an unguided sample's tokens do not depend on a guided neighbour"
        );
        for (x, y) in a.logprobs.iter().zip(&m.logprobs) {
            assert!((x - y).abs() < 1e-5, "{x} vs {y}");
        }
    }
}

#[test]
fn guided_logprobs_are_the_unmasked_models() {
    let client = cpu_client();
    let mut engine = engine(&client, 4);
    // The same weights again (the same seed), for the log-prob program.
    let (decoder, params) = model(&client);
    let temperature = 0.7;
    let mut request = guided(Guide::Regex("[a-z]{4,12}".into()), 4, 1, 16);
    request.params.temperature = temperature;
    request.params.logprobs_mode = LogprobsMode::Processed;
    let done = completions(&mut engine, request);
    let scorer = LogprobsRunner::new(&client, decoder, ElementType::F32).at_temperature(f64::from(temperature));
    let sequences: Vec<Vec<u32>> = done.iter().map(|c| [prompt(), c.tokens.clone()].concat()).collect();
    let scored = scorer.run(&params, &sequences).unwrap();
    let mut masked_mass_seen = false;
    for (c, s) in done.iter().zip(&scored) {
        let learner = &s.logprobs[prompt().len() - 1..];
        for (engine_lp, learner_lp) in c.logprobs.iter().zip(learner) {
            assert!(
                (engine_lp - learner_lp).abs() < 1e-4,
                "the engine recorded {engine_lp}, the policy gives {learner_lp}"
            );
            // A random model puts most of its mass outside `[a-z]`: masked
            // log-probs (renormalized over the allowed tokens) would be far larger.
            masked_mass_seen |= *engine_lp < -3.0;
        }
    }
    assert!(
        masked_mass_seen,
        "the tokens' unmasked log-probs show the mass the grammar removed"
    );
}

#[test]
fn guides_the_engine_cannot_serve_are_refused_by_name() {
    let client = cpu_client();
    let mut engine = engine(&client, 2);
    let refused = |engine: &mut Engine, request: Request| match engine.add_request(request) {
        Err(error @ (Error::InvalidRequest { .. } | Error::InvalidGuide { .. })) => error.to_string(),
        other => panic!("expected a refusal, got {other:?}"),
    };
    let bad_schema = guided(Guide::JsonSchema(json!({"type": "nonsense"})), 1, 0, 8);
    assert!(refused(&mut engine, bad_schema).contains("grammar is invalid"));
    let bad_regex = guided(Guide::Regex("(a|b".into()), 1, 0, 8);
    assert!(refused(&mut engine, bad_regex).contains("unclosed group"));
    assert!(refused(&mut engine, guided(Guide::Choice(Vec::new()), 1, 0, 8)).contains("choices is empty"));
    let mut with_min = guided(Guide::JsonObject, 1, 0, 8);
    with_min.params.min_tokens = 2;
    assert!(refused(&mut engine, with_min).contains("min_tokens"));
    let mut ignoring_eos = guided(Guide::JsonObject, 1, 0, 8);
    ignoring_eos.params.ignore_eos = true;
    assert!(refused(&mut engine, ignoring_eos).contains("ignore_eos"));
    assert!(!engine.has_work(), "nothing refused is queued");

    let (decoder, params) = model(&client);
    let mut bare = Engine::new(&client, decoder, params, EngineConfig::default()).unwrap();
    assert!(refused(&mut bare, guided(Guide::JsonObject, 1, 0, 8)).contains("need an engine with a tokenizer"));
}

#[test]
fn tool_call_guides_give_well_formed_calls() {
    use grpo_model::tools::{Tool, ToolCallFormat, parse_tool_calls};
    let client = cpu_client();
    let mut engine = engine(&client, 8);
    let tools = Tool::list_from_json(&json!([
        {"type": "function", "function": {"name": "calculate", "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "maxLength": 8}},
            "required": ["expression"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "flip", "parameters": {
            "type": "object", "properties": {"heads": {"type": "boolean"}},
            "required": ["heads"], "additionalProperties": false}}}
    ]))
    .unwrap();
    for format in [ToolCallFormat::Hermes, ToolCallFormat::Llama3Json] {
        for parallel in [false, true] {
            let guide = Guide::tool_calls(format, &tools, parallel).unwrap();
            let mut whole = 0;
            for c in completions(&mut engine, guided(guide, 8, 2, 60)) {
                if c.finish_reason != FinishReason::Stop {
                    continue;
                }
                whole += 1;
                let text = text(&c);
                let turn = parse_tool_calls(&text, format);
                assert!(turn.malformed().is_empty(), "{format:?}: {text:?}");
                assert!(turn.content.is_empty(), "{format:?}: only calls, not {text:?}");
                let calls = turn.well_formed();
                assert!(
                    !calls.is_empty() && (parallel || calls.len() == 1),
                    "{format:?}: {text:?}"
                );
                for call in calls {
                    match call.name.as_str() {
                        "calculate" => assert!(
                            call.arguments["expression"]
                                .as_str()
                                .is_some_and(|e| e.chars().count() <= 8)
                        ),
                        "flip" => assert!(call.arguments["heads"].is_boolean()),
                        other => panic!("called {other}"),
                    }
                }
            }
            // Parallel calls may go on (a random model rarely stops adding
            // them); one call always ends within the bound.
            assert!(
                parallel || whole >= 6,
                "{format:?}: only {whole} of 8 calls ended on their own"
            );
        }
    }
    assert!(Guide::tool_calls(ToolCallFormat::Hermes, &[], true).is_err());
}
