//! Stop strings over streamed text: matches spanning tokens (SmolLM2's, after
//! `grpo setup`), the earliest match winning, a match at the very start,
//! unicode, and on random texts cut at random: the same match however the
//! text is cut, and a streamed prefix that never reaches into a stop string
//! nor splits a character.

mod common;

use common::smollm2_tokenizer;
use grpo_rollout::detokenize::IncrementalDetokenizer;
use grpo_rollout::stop::{EmptyStopString, StopMatch, StopStrings};
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};

fn stops(strings: &[&str]) -> StopStrings {
    StopStrings::new(strings.iter().map(|s| s.to_string()).collect()).unwrap()
}

/// What a client streaming the chunks would get.
#[derive(Debug, PartialEq)]
struct Streamed {
    /// The match and the chunk it was found at, if a stop string occurred.
    stop: Option<(usize, StopMatch)>,
    /// The output: the text cut at the match, or all of it.
    output: String,
}

/// Appends the chunks one by one as an engine would: finds stop strings, else
/// streams up to [`StopStrings::emit_len`], checking that what it streams is
/// whole characters, only grows, is never cut from the output, and holds back
/// only what may begin a stop string.
fn stream(stops: &StopStrings, chunks: &[&str]) -> Streamed {
    let mut text = String::new();
    let mut emitted = 0;
    for (step, chunk) in chunks.iter().enumerate() {
        text.push_str(chunk);
        if let Some(found) = stops.find(&text, chunk.len()) {
            assert!(found.output_len >= emitted, "{text:?}: {found:?} cuts streamed text");
            assert_eq!(&text[found.start..found.end], stops.strings()[found.index]);
            return Streamed {
                stop: Some((step, found)),
                output: text[..found.output_len].to_string(),
            };
        }
        let len = stops.emit_len(&text);
        assert!(text.is_char_boundary(len), "{text:?}: {len} splits a character");
        assert!(len >= emitted, "{text:?}: streamed {emitted} bytes, then {len}");
        let held = &text[len..];
        assert!(
            held.is_empty() || stops.strings().iter().any(|stop| stop.starts_with(held)),
            "{text:?}: holds back {held:?}"
        );
        emitted = len;
    }
    Streamed {
        stop: None,
        output: text,
    }
}

/// The chunks SmolLM2's tokens of `text` stream as.
fn smollm2_chunks(text: &str) -> Vec<String> {
    let tokenizer = smollm2_tokenizer();
    let ids = tokenizer.encode(text, false).unwrap();
    let mut detokenizer = IncrementalDetokenizer::new(tokenizer.clone(), &[], true).unwrap();
    let mut chunks: Vec<String> = ids.iter().map(|&id| detokenizer.push(id).unwrap().to_owned()).collect();
    chunks.push(detokenizer.finish().unwrap().to_owned());
    assert_eq!(chunks.concat(), text);
    chunks
}

/// Streams `text` in SmolLM2's chunks; returns the match and how many
/// chunks it spans.
fn stream_smollm2(stops: &StopStrings, text: &str) -> (StopMatch, usize) {
    let chunks = smollm2_chunks(text);
    let chunks: Vec<&str> = chunks.iter().map(String::as_str).collect();
    let streamed = stream(stops, &chunks);
    let (step, found) = streamed.stop.expect("a stop string occurs");
    let chunk_of = |byte: usize| {
        let mut end = 0;
        chunks.iter().position(|chunk| {
            end += chunk.len();
            byte < end
        })
    };
    assert_eq!(
        chunk_of(found.end - 1),
        Some(step),
        "found as soon as its last chunk came"
    );
    (found, step + 1 - chunk_of(found.start).unwrap())
}

#[test]
fn empty_stop_strings_are_rejected() {
    let error = StopStrings::new(vec!["</s>".into(), String::new()]).unwrap_err();
    assert_eq!(error, EmptyStopString { index: 1 });
    assert_eq!(
        error.to_string(),
        "stop string 1 is empty: a stop string needs at least one character"
    );
    let none = StopStrings::default();
    assert!(none.is_empty());
    assert_eq!(none.find("any text", 3), None);
    assert_eq!(none.emit_len("any text"), 8);
}

#[test]
fn stop_strings_spanning_tokens() {
    let text = "The quick brown fox jumps over the lazy dog, 12345 times.";
    for (stop, spans) in [("quick brown", 2), ("brown fox jumps", 3), ("234", 3)] {
        let (found, spanned) = stream_smollm2(&stops(&[stop]), text);
        assert_eq!(spanned, spans, "{stop:?}");
        assert_eq!(found.start, text.find(stop).unwrap());
        assert_eq!(found.output_len, found.start);
        let included = stream_smollm2(&stops(&[stop]).include_in_output(true), text).0;
        assert_eq!(included.output_len, found.end);
    }
}

#[test]
fn the_earliest_match_wins() {
    let text = "The quick brown fox jumps over the lazy dog";
    let found = stream_smollm2(&stops(&["dog", "fox", "quick"]), text).0;
    assert_eq!((found.index, found.start), (2, 4));
    let at_once = stream(&stops(&["dog", "fox", "quick"]), &[text]);
    assert_eq!(at_once.stop, Some((0, found)));
    assert_eq!(at_once.output, "The ");
    // Overlapping matches in one chunk: the first to be complete wins; at one
    // end, the longer.
    let found = stream(&stops(&["abcde", "bcd"]), &["xabcdef"]).stop.unwrap().1;
    assert_eq!((found.index, found.start, found.end), (1, 2, 5));
    let found = stream(&stops(&["bc", "abc"]), &["xabcdef"]).stop.unwrap().1;
    assert_eq!((found.index, found.start, found.end), (1, 1, 4));
}

#[test]
fn a_stop_string_at_the_very_start() {
    let stops = stops(&["Hello"]);
    let (found, _) = stream_smollm2(&stops, "Hello world");
    assert_eq!((found.start, found.output_len), (0, 0));
    let included = stops.include_in_output(true);
    assert_eq!(stream(&included, &["Hel", "lo", " world"]).output, "Hello");
}

#[test]
fn unicode_stop_strings() {
    let text = "Le café est prêt 🎉 終わり。";
    let (found, spanned) = stream_smollm2(&stops(&["終わり", "🎉"]), text);
    assert_eq!((found.index, found.start), (1, text.find('🎉').unwrap()));
    assert!(
        spanned == 1 && smollm2_chunks(text).contains(&String::new()),
        "🎉 is split over tokens"
    );
    let (found, _) = stream_smollm2(&stops(&["t 🎉 終"]), text);
    assert_eq!(&text[..found.output_len], "Le café est prê");
    let found = stream(&stops(&["é"]), &["Le caf", "é"]).stop.unwrap().1;
    assert_eq!(found.start, "Le caf".len());
}

#[test]
fn emit_len_holds_back_exactly_the_longest_stop_prefix() {
    let world = stops(&["world"]);
    for (text, len) in [("hello", 5), ("hello w", 6), ("hello wor", 6), ("", 0), ("wo", 0)] {
        assert_eq!(world.emit_len(text), len, "{text:?}");
    }
    let overlapping = stops(&["abc", "bcd", "cx"]);
    for (text, len) in [("xab", 1), ("xbc", 1), ("xa", 1), ("xac", 2), ("xbb", 2), ("xdd", 3)] {
        assert_eq!(overlapping.emit_len(text), len, "{text:?}");
    }
    let unicode = stops(&["終わり", "éa"]);
    assert_eq!(unicode.emit_len("もう終"), "もう".len());
    assert_eq!(unicode.emit_len("もう終わ"), "もう".len());
    assert_eq!(unicode.emit_len("café"), "caf".len());
    assert_eq!(unicode.emit_len("cafe"), 4);
    assert_eq!(unicode.include_in_output(true).emit_len("もう終"), "もう終".len());
}

/// The first match by brute force over the whole text: the earliest end, then start.
fn first_match(stops: &StopStrings, text: &str) -> Option<(usize, usize, usize)> {
    stops
        .strings()
        .iter()
        .enumerate()
        .filter_map(|(index, stop)| text.find(stop.as_str()).map(|start| (index, start, start + stop.len())))
        .min_by_key(|&(_, start, end)| (end, start))
}

/// A string of 1 to `max_chars` characters from a small alphabet of 1- to 4-byte ones.
fn random_string(rng: &mut StdRng, max_chars: usize) -> String {
    const ALPHABET: &[&str] = &["a", "b", "é", "😀", " ", "\n", "終"];
    let chars = rng.random_range(1..=max_chars);
    (0..chars).map(|_| *ALPHABET.choose(rng).unwrap()).collect()
}

#[test]
fn random_texts_cut_at_random_stream_the_same() {
    let mut rng = StdRng::seed_from_u64(3);
    let mut matched = 0;
    for case in 0..2000 {
        let strings: Vec<String> = (0..rng.random_range(1..=3))
            .map(|_| random_string(&mut rng, 4))
            .collect();
        let stops = StopStrings::new(strings).unwrap().include_in_output(case % 4 == 0);
        let text = random_string(&mut rng, 30);
        let chars: Vec<&str> = text.split_inclusive(|_| true).collect();
        let mut chunks = Vec::new();
        let mut rest = text.as_str();
        while !rest.is_empty() {
            let take = rest
                .char_indices()
                .nth(rng.random_range(1..=4))
                .map_or(rest.len(), |(at, _)| at);
            let (chunk, tail) = rest.split_at(take);
            chunks.push(chunk);
            rest = tail;
        }
        let streamed = stream(&stops, &chunks);
        assert_eq!(
            streamed.output,
            stream(&stops, &chars).output,
            "{text:?} {stops:?} {chunks:?}"
        );
        let found = streamed.stop.map(|(_, found)| (found.index, found.start, found.end));
        assert_eq!(found, first_match(&stops, &text), "{text:?} {stops:?} {chunks:?}");
        matched += usize::from(found.is_some());
    }
    assert!(matched > 500, "only {matched} cases matched");
}
