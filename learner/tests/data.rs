//! Prompt data: JSONL rows with text or chat prompts (five GSM8K test rows
//! committed as a fixture), errors naming file and line, the eval split,
//! and the seeded sampler (epochs cover every row once; resuming continues
//! the same order).

use std::io::Write;
use std::path::Path;

use grpo_learner::data::{Prompt, PromptSampler, load_examples, split};
use grpo_rollout::guided::Guide;

fn write(lines: &[&str]) -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    for line in lines {
        writeln!(file, "{line}").unwrap();
    }
    file
}

#[test]
fn gsm8k_rows_keep_their_other_columns() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gsm8k_5.jsonl");
    let rows = load_examples(&path, "train", "question").unwrap();
    assert_eq!(rows.len(), 5);
    let Prompt::Text(text) = &rows[0].prompt else {
        panic!("a text prompt")
    };
    assert!(text.starts_with("Janet"));
    assert!(rows[0].columns["answer"].as_str().unwrap().ends_with("#### 18"));
    assert!(!rows[0].columns.contains_key("question"));
}

#[test]
fn chat_prompts_and_errors_that_name_the_line() {
    let file = write(&[
        r#"{"prompt": [{"role": "user", "content": "2 + 3?"}], "answer": "5"}"#,
        "",
        r#"{"prompt": "plain", "answer": 1}"#,
    ]);
    let rows = load_examples(file.path(), "train", "prompt").unwrap();
    assert_eq!(rows.len(), 2);
    assert!(matches!(&rows[0].prompt, Prompt::Chat(turns) if turns[0].text() == "2 + 3?"));
    assert_eq!(rows[0].guide, None);
    let guided = write(&[r#"{"prompt": "a", "structured_outputs": {"regex": "[0-9]+"}}"#]);
    let rows = load_examples(guided.path(), "train", "prompt").unwrap();
    assert_eq!(rows[0].guide, Some(Guide::Regex("[0-9]+".to_string())));
    for (lines, needle) in [
        (vec![r#"{"prompt": "a"}"#, "not json"], ":2: not JSON"),
        (vec![r#"{"question": "a"}"#], ":1: no `prompt` column"),
        (vec![r#"{"prompt": 3}"#], "must be text or a list"),
        (vec![r#"{"prompt": [{"role": "user"}]}"#], "chat turns"),
        (vec!["[1, 2]"], "JSON object"),
        (
            vec![r#"{"prompt": "a", "structured_outputs": {"choice": "x"}}"#],
            ":1: `structured_outputs`: choice must be a list of strings",
        ),
        (vec![], "no rows"),
    ] {
        let file = write(&lines);
        let error = load_examples(file.path(), "train", "prompt").unwrap_err().to_string();
        assert!(error.contains(needle), "{error} should say {needle}");
    }
}

#[test]
fn the_split_and_the_sampler_are_seeded_and_resumable() {
    let lines: Vec<String> = (0..20).map(|i| format!(r#"{{"prompt": "p{i}"}}"#)).collect();
    let file = write(&lines.iter().map(String::as_str).collect::<Vec<_>>());
    let rows = load_examples(file.path(), "train", "prompt").unwrap();
    let (train, eval) = split(rows.clone(), 5, 3).unwrap();
    assert_eq!((train.len(), eval.len()), (15, 5));
    let (_, again) = split(rows.clone(), 5, 3).unwrap();
    assert_eq!(eval, again, "the same seed holds out the same rows");
    assert!(split(rows, 20, 3).unwrap_err().to_string().contains("eval_size"));

    let mut sampler = PromptSampler::new(15, 9);
    let first_epoch: Vec<usize> = (0..5).flat_map(|_| sampler.next_batch(3)).collect();
    let mut sorted = first_epoch.clone();
    sorted.sort();
    assert_eq!(sorted, (0..15).collect::<Vec<_>>(), "an epoch hands out every row once");
    let part = sampler.next_batch(4);
    let saved = sampler.state();
    assert_eq!((saved.epoch, saved.position), (1, 4));
    let next = sampler.next_batch(6);
    let mut resumed = PromptSampler::resume(15, 9, saved);
    assert_eq!(
        resumed.next_batch(6),
        next,
        "a resumed sampler continues the same order"
    );
    assert_ne!(part, first_epoch[..4], "each epoch is reshuffled");
}
