//! Completion text from an engine with a tokenizer: the streamed deltas add
//! up to the completion's text, which is the tokenizer's decode of its
//! tokens; stop strings end a sample across token boundaries, cut from the
//! text (or kept, if asked), and nothing past them is ever streamed.

mod common;

use std::collections::HashMap;

use common::{cpu_client, fixture, tiny_tokenizer};
use grpo_rollout::engine::Engine;
use grpo_rollout::output::{Completion, FinishReason, StopReason};
use grpo_rollout::request::{Request, SamplingParams};

fn engine() -> Engine {
    common::engine(&cpu_client(), fixture("llama").to_str().unwrap(), 4, 64).with_tokenizer(tiny_tokenizer())
}

/// Runs `requests` through `step`, returning each sample's completion and
/// its streamed text, by (request, sample).
fn run(engine: &mut Engine, requests: &[Request]) -> Vec<(Completion, String)> {
    let ids: Vec<u64> = requests
        .iter()
        .map(|r| engine.add_request(r.clone()).unwrap())
        .collect();
    let mut streamed: HashMap<(u64, usize), String> = HashMap::new();
    let mut done = HashMap::new();
    while engine.has_work() {
        for update in engine.step().unwrap() {
            let key = (update.request, update.index);
            let text = streamed.entry(key).or_default();
            assert!(!done.contains_key(&key), "nothing streams after a sample ends");
            text.push_str(&update.text);
            if let Some(completion) = update.finished {
                done.insert(key, completion);
            }
        }
    }
    ids.iter()
        .flat_map(|&id| {
            let n = requests[ids.iter().position(|&i| i == id).unwrap()].params.n;
            (0..n).map(move |i| (id, i))
        })
        .map(|key| (done.remove(&key).unwrap(), streamed.remove(&key).unwrap_or_default()))
        .collect()
}

fn request(seed: u32, n: usize) -> Request {
    Request {
        prompt: vec![72, 101, 108, 108, 111],
        params: SamplingParams {
            n,
            max_tokens: 24,
            temperature: if seed == 0 { 0.0 } else { 1.0 },
            seed,
            ignore_eos: true,
            ..SamplingParams::default()
        },
    }
}

#[test]
fn streamed_text_adds_up_to_the_decoded_completion() {
    let tokenizer = tiny_tokenizer();
    let mut engine = engine();
    let requests = [request(0, 1), request(5, 3)];
    for (completion, streamed) in run(&mut engine, &requests) {
        let text = completion.text.clone().unwrap();
        assert_eq!(text, tokenizer.decode(&completion.tokens, true).unwrap());
        assert_eq!(streamed, text);
    }
}

#[test]
fn stop_strings_cut_the_text_across_token_boundaries() {
    let mut engine = engine();
    let (free, _) = run(&mut engine, &[request(0, 1)]).remove(0);
    let text = free.text.unwrap();
    // A stop string of three characters from the middle of the greedy text.
    let starts: Vec<usize> = text.char_indices().map(|(i, _)| i).chain([text.len()]).collect();
    assert!(starts.len() > 8, "the greedy text is long enough: {text:?}");
    let (from, to) = (starts[starts.len() / 2], starts[starts.len() / 2 + 3]);
    let stop = text[from..to].to_string();
    let first = text.find(&stop).unwrap();
    for include in [false, true] {
        let mut stopped = request(0, 1);
        stopped.params.stop = vec![stop.clone()];
        stopped.params.include_stop_str_in_output = include;
        let (completion, streamed) = run(&mut engine, &[stopped]).remove(0);
        let want = &text[..if include { first + stop.len() } else { first }];
        assert_eq!(completion.finish_reason, FinishReason::Stop);
        assert_eq!(completion.stop_reason, Some(StopReason::String(stop.clone())));
        assert_eq!(completion.text.as_deref(), Some(want), "include {include}");
        assert_eq!(streamed, want, "include {include}: the stream never shows the cut text");
        assert_eq!(completion.tokens[..], free.tokens[..completion.tokens.len()]);
        assert!(completion.tokens.len() < free.tokens.len());
    }
}
