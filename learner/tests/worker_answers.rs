//! What a worker answers is checked before it can become training data:
//! the request's `n` samples, each once, within `max_tokens`, token ids in
//! the vocabulary, one finite log-prob ≤ 0 and one version per token.

use grpo_learner::fleet::check_answer;
use grpo_rollout::output::{Completion, FinishReason};
use grpo_rollout::request::{Request, SamplingParams};

const VOCAB: usize = 100;

fn request(n: usize) -> Request {
    Request {
        prompt: vec![1, 2, 3],
        params: SamplingParams {
            n,
            max_tokens: 4,
            ..SamplingParams::default()
        },
    }
}

fn sample(index: usize, tokens: Vec<u32>) -> Completion {
    let count = tokens.len();
    Completion {
        index,
        tokens,
        logprobs: vec![-0.5; count],
        top_logprobs: vec![Vec::new(); count],
        versions: vec![3; count],
        text: None,
        finish_reason: FinishReason::Length,
        stop_reason: None,
    }
}

#[test]
fn a_well_formed_answer_passes() {
    let samples = [sample(1, vec![5, 6]), sample(0, vec![7, 8, 9, 10])];
    assert!(check_answer(&request(2), &samples, VOCAB).is_ok());
}

#[test]
fn every_kind_of_bad_answer_is_a_worker_fault_naming_it() {
    let good = || vec![sample(0, vec![5, 6]), sample(1, vec![7])];
    let mut cases: Vec<(Vec<Completion>, &str)> = Vec::new();
    cases.push((good()[..1].to_vec(), "1 samples for n = 2"));
    let mut twice = good();
    twice[1].index = 0;
    cases.push((twice, "sample index 0 twice"));
    let mut beyond = good();
    beyond[1].index = 2;
    cases.push((beyond, "sample index 2 twice or beyond n = 2"));
    cases.push((
        vec![sample(0, vec![1; 5]), sample(1, vec![7])],
        "5 tokens for max_tokens = 4",
    ));
    cases.push((
        vec![sample(0, vec![5, 100]), sample(1, vec![7])],
        "token id 100 outside the vocabulary of 100",
    ));
    let mut short = good();
    short[0].logprobs.pop();
    cases.push((short, "2 tokens with 1 log-probs"));
    let mut versions = good();
    versions[1].versions.clear();
    cases.push((versions, "1 tokens with 1 log-probs and 0 versions"));
    for logprob in [f32::NAN, f32::INFINITY, 0.5] {
        let mut bad = good();
        bad[0].logprobs[1] = logprob;
        cases.push((bad, "not a finite number at most 0"));
    }
    for (samples, reason) in cases {
        let failure = check_answer(&request(2), &samples, VOCAB).unwrap_err();
        assert!(failure.message.contains(reason), "{reason}: {}", failure.message);
        assert!(!failure.permanent, "the worker may answer well again");
    }
}
