//! Datasets as users have them, written by pandas and pyarrow in the test
//! venv: a Parquet file, a folder laid out as on the Hugging Face Hub
//! (`data/<split>-*.parquet`, two shards), and the layout of
//! `datasets.save_to_disk` (`dataset_dict.json`, a folder per split with
//! Arrow stream files and `state.json`). Each reads to the rows written,
//! text and chat prompts alike, other columns kept; a missing split is
//! refused naming the splits there.

#[path = "../../tools/test_python.rs"]
mod test_python;

use std::path::Path;

use grpo_learner::config::DataSection;
use grpo_learner::data::{Example, Prompt, load_examples};
use serde_json::json;

/// Writes the three layouts into `dir`: train rows "q0".."q5" (chat
/// prompts for even ones) with `answer` i, test rows "t0", "t1".
const WRITE: &str = r#"
import json, pathlib, sys
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

out = pathlib.Path(sys.argv[1])

def rows(prefix, n):
    for i in range(n):
        text = f"{prefix}{i}"
        prompt = [{"role": "user", "content": text}] if i % 2 == 0 else None
        yield {"text": text, "chat": prompt, "answer": i}

def table(prefix, n):
    return pa.Table.from_pylist(list(rows(prefix, n)))

pd.DataFrame(list(rows("q", 6))).to_parquet(out / "prompts.parquet")

hub = out / "hub" / "data"
hub.mkdir(parents=True)
train = table("q", 6)
pq.write_table(train.slice(0, 4), hub / "train-00000-of-00002.parquet")
pq.write_table(train.slice(4), hub / "train-00001-of-00002.parquet")
pq.write_table(table("t", 2), hub / "test-00000-of-00001.parquet")

saved = out / "saved"
for split, prefix, n in [("train", "q", 6), ("test", "t", 2)]:
    folder = saved / split
    folder.mkdir(parents=True)
    with pa.ipc.new_stream(folder / "data-00000-of-00001.arrow", table(prefix, n).schema) as writer:
        for batch in table(prefix, n).to_batches(max_chunksize=4):
            writer.write_batch(batch)
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_split": split}))
    (folder / "dataset_info.json").write_text("{}")
(saved / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
"#;

fn write_layouts(dir: &Path) {
    let output = std::process::Command::new(test_python::test_python())
        .arg("-c")
        .arg(WRITE)
        .arg(dir)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}

/// The prompt texts and answers of `examples`.
fn summary(examples: &[Example]) -> Vec<(String, i64)> {
    examples
        .iter()
        .map(|e| {
            let text = match &e.prompt {
                Prompt::Text(text) => text.clone(),
                Prompt::Chat(turns) => turns[0].content.clone().unwrap_or_default(),
            };
            (text, e.columns["answer"].as_i64().unwrap())
        })
        .collect()
}

fn expected(prefix: &str, n: i64) -> Vec<(String, i64)> {
    (0..n).map(|i| (format!("{prefix}{i}"), i)).collect()
}

#[test]
fn parquet_files_hub_folders_and_saved_datasets_read_as_their_rows() {
    let dir = tempfile::tempdir().unwrap();
    write_layouts(dir.path());
    for path in ["prompts.parquet", "hub", "saved"] {
        let path = dir.path().join(path);
        let text = load_examples(&path, "train", "text").unwrap();
        assert_eq!(summary(&text), expected("q", 6), "{}", path.display());
        assert!(text.iter().all(|e| matches!(e.prompt, Prompt::Text(_))));
        // A row whose prompt is null (the second) is refused naming its file and row.
        let chat = load_examples(&path, "train", "chat").unwrap_err().to_string();
        assert!(chat.contains(":2: ") && chat.contains("`chat`"), "{chat}");
    }
    let test = load_examples(&dir.path().join("hub"), "test", "text").unwrap();
    assert_eq!(summary(&test), expected("t", 2));
    let missing = load_examples(&dir.path().join("saved"), "validation", "text")
        .unwrap_err()
        .to_string();
    assert!(
        missing.contains("no split `validation` (splits here: test, train)"),
        "{missing}"
    );
    let missing = load_examples(&dir.path().join("hub"), "validation", "text")
        .unwrap_err()
        .to_string();
    assert!(missing.contains("no `validation` split"), "{missing}");

    // [data] with TRL's split names: train from one split, eval from another.
    let section: DataSection = serde_json::from_value(json!({
        "path": dir.path().join("saved"),
        "prompt_column": "text",
        "dataset_train_split": "train",
        "dataset_test_split": "test",
    }))
    .unwrap();
    let (train, eval) = section.load().unwrap();
    assert_eq!((summary(&train), summary(&eval)), (expected("q", 6), expected("t", 2)));
}

#[test]
fn chat_prompts_in_parquet_become_chat_turns() {
    let dir = tempfile::tempdir().unwrap();
    let script = r#"
import sys
import pyarrow as pa, pyarrow.parquet as pq
messages = [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"q{i}"}] for i in range(3)]
pq.write_table(pa.table({"prompt": messages, "answer": ["a", "b", "c"]}), sys.argv[1])
"#;
    let path = dir.path().join("chat.parquet");
    let output = std::process::Command::new(test_python::test_python())
        .args(["-c", script])
        .arg(&path)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let rows = load_examples(&path, "train", "prompt").unwrap();
    assert_eq!(rows.len(), 3);
    for (i, row) in rows.iter().enumerate() {
        let Prompt::Chat(turns) = &row.prompt else {
            panic!("{:?} is not a chat", row.prompt)
        };
        let said: Vec<(&str, &str)> = turns
            .iter()
            .map(|t| (t.role.as_str(), t.content.as_deref().unwrap_or_default()))
            .collect();
        assert_eq!(said, [("system", "Be brief."), ("user", format!("q{i}").as_str())]);
        assert_eq!(row.columns["answer"], json!(["a", "b", "c"][i]));
    }
}
