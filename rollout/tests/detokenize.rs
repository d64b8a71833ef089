//! The incremental detokenizer: for any tokens, its deltas join into
//! `decode(completion)`: SmolLM2's byte-level BPE (after `grpo setup`) on
//! real texts cut at every token, on random ids, with special tokens skipped
//! and kept; the tiny fixture tokenizer; a decoder dropping the text's first
//! space (as SentencePiece's do); and a decoder it cannot stream.

mod common;

use std::sync::Arc;

use common::{smollm2_tokenizer, tiny_tokenizer};
use grpo_model::tokenizer::Tokenizer;
use grpo_rollout::detokenize::IncrementalDetokenizer;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const REPLACEMENT: char = char::REPLACEMENT_CHARACTER;

/// Texts with accents, CJK, emoji (multi-codepoint ones too), digits and odd spacing.
const TEXTS: &[&str] = &[
    "Hello, world! 123 + 4567 = 4690.",
    "Café naïve façade — résumé, Straße, Ångström.",
    "日本語のテキストと中文混合。한국어도 있어요.",
    "Emoji: 😀🎉👍🏽 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 end",
    "  leading spaces,\ttabs\n\nnewlines   and trailing  ",
    "Math: ∑ x² ≈ π/4; arrows → ← ↔ 🧮",
];

/// What streaming `completion` after `prompt` gave: each push's delta, then finish's.
struct Streamed {
    pushes: Vec<String>,
    flushed: String,
}

/// Streams `completion` after `prompt` and checks that the deltas join into
/// `decode(completion)` and `text()`, and that no push ends in U+FFFD.
fn check_stream(tokenizer: &Arc<Tokenizer>, prompt: &[u32], completion: &[u32], skip: bool) -> Streamed {
    let mut detokenizer = IncrementalDetokenizer::new(tokenizer.clone(), prompt, skip).unwrap();
    let pushes: Vec<String> = completion
        .iter()
        .map(|&token| detokenizer.push(token).unwrap().to_owned())
        .collect();
    let flushed = detokenizer.finish().unwrap().to_owned();
    let joined = pushes.concat() + &flushed;
    let expected = tokenizer.decode(completion, skip).unwrap();
    assert_eq!(
        joined, expected,
        "prompt {prompt:?}, completion {completion:?}, skip {skip}"
    );
    assert_eq!(detokenizer.text(), expected);
    assert!(pushes.iter().all(|delta| !delta.ends_with(REPLACEMENT)), "{pushes:?}");
    Streamed { pushes, flushed }
}

/// `ids` cut into prompt and completion at every token; returns how many cuts
/// held text back (a push gave nothing) and how many prompts ended inside a character.
fn check_every_cut(tokenizer: &Arc<Tokenizer>, ids: &[u32]) -> (usize, usize) {
    let (mut held_back, mut mid_char_prompts) = (0, 0);
    for cut in 0..=ids.len() {
        let (prompt, completion) = ids.split_at(cut);
        let streamed = check_stream(tokenizer, prompt, completion, true);
        held_back += usize::from(streamed.pushes.iter().any(String::is_empty));
        mid_char_prompts += usize::from(tokenizer.decode(prompt, true).unwrap().ends_with(REPLACEMENT));
    }
    (held_back, mid_char_prompts)
}

#[test]
fn smollm2_streams_real_texts_cut_at_every_token() {
    let tokenizer = smollm2_tokenizer();
    let (mut held_back, mut mid_char_prompts) = (0, 0);
    for text in TEXTS {
        let ids = tokenizer.encode(text, false).unwrap();
        assert_eq!(tokenizer.decode(&ids, true).unwrap(), *text);
        let streamed = check_stream(&tokenizer, &[], &ids, true);
        assert!(
            streamed.flushed.is_empty(),
            "{text:?}: a valid text holds nothing back at the end"
        );
        let (held, mid_char) = check_every_cut(&tokenizer, &ids);
        held_back += held;
        mid_char_prompts += mid_char;
    }
    assert!(held_back > 0, "no text split a character over tokens");
    assert!(mid_char_prompts > 0, "no prompt ended inside a character");
}

#[test]
fn smollm2_first_token_keeps_its_leading_space() {
    let tokenizer = smollm2_tokenizer();
    let prompt = tokenizer.encode("The capital of France is", false).unwrap();
    let completion = tokenizer.encode(" Paris, of course.", false).unwrap();
    let streamed = check_stream(&tokenizer, &prompt, &completion, true);
    assert_eq!(streamed.pushes[0], " Paris");
    assert_eq!(streamed.pushes.concat(), " Paris, of course.");
}

#[test]
fn smollm2_special_tokens_skipped_or_kept() {
    let tokenizer = smollm2_tokenizer();
    let encode = |text: &str| tokenizer.encode(text, false).unwrap();
    let prompt_text = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n";
    let completion_text = "4 🎉<|im_end|>";
    let (prompt, completion) = (encode(prompt_text), encode(completion_text));
    let eos = tokenizer.eos_id().unwrap();
    assert_eq!(completion.last(), Some(&eos));
    let chat = [prompt.as_slice(), &completion].concat();

    let kept = check_stream(&tokenizer, &[], &chat, false);
    assert_eq!(kept.pushes.concat(), prompt_text.to_string() + completion_text);
    let skipped = check_stream(&tokenizer, &[], &chat, true);
    assert_eq!(skipped.pushes.concat(), "user\nWhat is 2+2?\nassistant\n4 🎉");
    for (&id, delta) in chat.iter().zip(&skipped.pushes) {
        if tokenizer.decode(&[id], true).unwrap().is_empty() {
            assert_eq!(delta, "", "special token {id}");
        }
    }
    // After the chat prompt (special tokens and all) as context.
    assert_eq!(
        check_stream(&tokenizer, &prompt, &completion, true).pushes.concat(),
        "4 🎉"
    );
    assert_eq!(
        check_stream(&tokenizer, &prompt, &completion, false).pushes.concat(),
        completion_text
    );
    let (held_back, mid_char_prompts) = check_every_cut(&tokenizer, &chat);
    let emoji_tokens = encode(" 🎉").len();
    assert!(emoji_tokens > 1, "🎉 is one token");
    assert_eq!(
        mid_char_prompts,
        emoji_tokens - 1,
        "only cuts inside 🎉 end inside a character"
    );
    assert!(held_back > 0);
}

/// `n` random ids, half of them from the first 512 (single bytes, special tokens).
fn random_ids(rng: &mut StdRng, vocab: u32, n: usize) -> Vec<u32> {
    (0..n)
        .map(|_| {
            let end = if rng.random_bool(0.5) { vocab.min(512) } else { vocab };
            rng.random_range(0..end)
        })
        .collect()
}

/// Streams `sequences` random completions after random prompts, skipping
/// special tokens and not; some must end inside a character.
fn check_random_ids(tokenizer: &Arc<Tokenizer>, seed: u64, sequences: usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    let vocab = tokenizer.vocab_size() as u32;
    let mut flushed = 0;
    for _ in 0..sequences {
        let prompt_len = rng.random_range(0..8);
        let prompt = random_ids(&mut rng, vocab, prompt_len);
        let completion = random_ids(&mut rng, vocab, 40);
        for skip in [false, true] {
            flushed += usize::from(!check_stream(tokenizer, &prompt, &completion, skip).flushed.is_empty());
        }
    }
    assert!(flushed > 0, "no completion ended inside a character");
}

#[test]
fn smollm2_streams_random_ids() {
    check_random_ids(&smollm2_tokenizer(), 7, 200);
}

#[test]
fn tiny_tokenizer_streams_texts_and_random_ids() {
    let tokenizer = tiny_tokenizer();
    for text in TEXTS {
        let ids = tokenizer.encode(text, false).unwrap();
        assert_eq!(tokenizer.decode(&ids, true).unwrap(), *text);
        check_every_cut(&tokenizer, &ids);
    }
    check_random_ids(&tokenizer, 11, 200);
}

/// The tiny tokenizer with another decoder, written under the test target's scratch folder.
fn tiny_with_decoder(name: &str, decoder: serde_json::Value) -> Arc<Tokenizer> {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../model/tests/fixtures/tokenizer/tiny/tokenizer.json"
    );
    let mut json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
    json["decoder"] = decoder;
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, json.to_string()).unwrap();
    Arc::new(Tokenizer::from_file(&path).unwrap())
}

#[test]
fn the_prompt_gives_the_first_token_its_leading_space() {
    // Byte-level, then the text's first space dropped, as SentencePiece decoders do.
    let decoder = serde_json::json!({"type": "Sequence", "decoders": [
        {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0},
    ]});
    let tokenizer = tiny_with_decoder("strip_first_space", decoder);
    let prompt = tokenizer.encode("Hello", false).unwrap();
    let completion = tokenizer.encode(" world", false).unwrap();
    assert_eq!(tokenizer.decode(&completion, true).unwrap(), "world");
    let text = |prompt: &[u32]| {
        let mut detokenizer = IncrementalDetokenizer::new(tokenizer.clone(), prompt, true).unwrap();
        for &token in &completion {
            detokenizer.push(token).unwrap();
        }
        detokenizer.finish().unwrap();
        detokenizer.text().to_owned()
    };
    assert_eq!(text(&prompt), " world");
    assert_eq!(text(&[]), "world");
}

#[test]
fn a_decoder_that_rewrites_earlier_text_is_an_error() {
    // Fuse, then replace "ab" by "X": the text of `a` changes once `b` follows.
    let decoder = serde_json::json!({"type": "Sequence", "decoders": [
        {"type": "Fuse"},
        {"type": "Replace", "pattern": {"String": "ab"}, "content": "X"},
    ]});
    let tokenizer = tiny_with_decoder("rewriting_decoder", decoder);
    let id = |token: &str| tokenizer.token_to_id(token).unwrap();
    let mut detokenizer = IncrementalDetokenizer::new(tokenizer.clone(), &[], true).unwrap();
    assert_eq!(detokenizer.push(id("a")).unwrap(), "a");
    let error = detokenizer.push(id("b")).unwrap_err().to_string();
    assert!(error.contains("cannot stream text"), "{error}");
}
