//! The rollout log: parts written per step, read back field for field,
//! truncated on resume, robust to a crash's temp files, and readable by
//! Parquet readers other than ours.

#[path = "../../tools/test_python.rs"]
mod test_python;

use std::fs::File;
use std::path::{Path, PathBuf};

use grpo_learner::Error;
use grpo_learner::record::{DIR_NAME, EpisodeRecord, RolloutLog, RolloutRow, read_rollouts};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;

/// `groups × samples` rows of `step`, every field varied (unicode,
/// newlines, empty text, failed rewards, every finish reason).
fn rows(step: u64, groups: u32, samples: u32) -> Vec<RolloutRow> {
    let mut out = Vec::new();
    for group in 0..groups {
        for sample in 0..samples {
            let k = out.len();
            out.push(RolloutRow {
                step,
                policy_version: step * 10 + 3,
                group,
                sample,
                prompt: format!("<|user|>\nWhat is {group} + {step}? ünï✓\n"),
                completion: if k % 4 == 3 {
                    String::new()
                } else {
                    format!("The answer is {}.\n\"quoted\"", k * 7)
                },
                reward: if k % 3 == 2 { None } else { Some(k as f32 * 0.25 - 1.0) },
                advantage: (k as f32 - 1.5) / 3.0,
                completion_tokens: 17 + k as u32,
                finish_reason: ["stop", "length", "abort"][k % 3].to_string(),
                columns: format!(r#"{{"answer":"{}","id":{k}}}"#, group + step as u32),
                episode: (k % 2 == 1).then(|| EpisodeRecord {
                    messages: format!(
                        r#"[{{"role":"assistant","content":"ünï {k}"}},{{"role":"tool","content":"{k}"}}]"#
                    ),
                    token_ids: (0..k as u32 % 5).map(|t| t * 1000 + 7).collect(),
                    loss_mask: (0..k % 5).map(|t| t % 2 == 0).collect(),
                    turns: 1 + k as u32 % 3,
                    tool_calls: k as u32 % 4,
                    end: ["done", "max_turns", "token_budget"][k % 3].to_string(),
                }),
            });
        }
    }
    out
}

fn part_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

fn num_rows(path: &Path) -> i64 {
    SerializedFileReader::new(File::open(path).unwrap())
        .unwrap()
        .metadata()
        .file_metadata()
        .num_rows()
}

#[test]
fn two_steps_read_back_field_for_field() {
    let out = tempfile::tempdir().unwrap();
    let log = RolloutLog::open(out.path()).unwrap();
    assert_eq!(log.dir(), out.path().join(DIR_NAME));
    assert_eq!(log.dir(), out.path().join("rollouts.parquet"));

    let step0 = rows(0, 2, 3);
    let step1 = rows(1, 3, 4);
    let p0 = log.append(0, &step0).unwrap();
    let p1 = log.append(1, &step1).unwrap();
    assert_eq!(p0, log.dir().join("step-000000.parquet"));
    assert_eq!(p1, log.dir().join("step-000001.parquet"));
    assert_eq!(part_names(log.dir()), ["step-000000.parquet", "step-000001.parquet"]);
    assert_eq!(num_rows(&p0), 6);
    assert_eq!(num_rows(&p1), 12);

    let back = read_rollouts(log.dir()).unwrap();
    assert_eq!(back.len(), 18);
    let expected: Vec<RolloutRow> = step0.into_iter().chain(step1).collect();
    assert_eq!(back, expected);
    // Failed rewards come back as None, not as 0 or NaN.
    assert!(back.iter().any(|r| r.reward.is_none()));
    assert!(back.iter().any(|r| r.reward.is_some()));
}

#[test]
fn steps_read_back_in_step_order_not_name_order() {
    let out = tempfile::tempdir().unwrap();
    let log = RolloutLog::open(out.path()).unwrap();
    // Written out of order, and past six digits, where names sort wrongly as text.
    for step in [1_000_000u64, 5, 999_999] {
        log.append(step, &rows(step, 1, 2)).unwrap();
    }
    let steps: Vec<u64> = read_rollouts(log.dir()).unwrap().iter().map(|r| r.step).collect();
    assert_eq!(steps, [5, 5, 999_999, 999_999, 1_000_000, 1_000_000]);
    assert!(log.dir().join("step-1000000.parquet").is_file());
}

#[test]
fn the_part_holds_the_documented_columns_for_any_parquet_reader() {
    let out = tempfile::tempdir().unwrap();
    let log = RolloutLog::open(out.path()).unwrap();
    let written = rows(7, 1, 3);
    let path = log.append(7, &written).unwrap();

    // The parquet crate's row reader: no arrow schema, only Parquet's own.
    let reader = SerializedFileReader::new(File::open(&path).unwrap()).unwrap();
    let names: Vec<String> = reader
        .metadata()
        .file_metadata()
        .schema_descr()
        .columns()
        .iter()
        .map(|c| c.path().string())
        .collect();
    assert_eq!(
        names,
        [
            "step",
            "policy_version",
            "group",
            "sample",
            "prompt",
            "completion",
            "reward",
            "advantage",
            "completion_tokens",
            "finish_reason",
            "columns",
            "messages",
            "token_ids.list.item",
            "loss_mask.list.item",
            "turns",
            "tool_calls",
            "episode_end"
        ]
    );
    let got: Vec<_> = reader.get_row_iter(None).unwrap().map(|r| r.unwrap()).collect();
    assert_eq!(got.len(), 3);
    for (row, want) in got.iter().zip(&written) {
        let fields: Vec<(&String, &Field)> = row.get_column_iter().collect();
        assert_eq!(fields[0].1, &Field::ULong(want.step));
        assert_eq!(fields[1].1, &Field::ULong(want.policy_version));
        assert_eq!(fields[2].1, &Field::UInt(want.group));
        assert_eq!(fields[3].1, &Field::UInt(want.sample));
        assert_eq!(fields[4].1, &Field::Str(want.prompt.clone()));
        assert_eq!(fields[5].1, &Field::Str(want.completion.clone()));
        match want.reward {
            Some(r) => assert_eq!(fields[6].1, &Field::Float(r)),
            None => assert_eq!(fields[6].1, &Field::Null),
        }
        assert_eq!(fields[7].1, &Field::Float(want.advantage));
        assert_eq!(fields[8].1, &Field::UInt(want.completion_tokens));
        assert_eq!(fields[9].1, &Field::Str(want.finish_reason.clone()));
        assert_eq!(fields[10].1, &Field::Str(want.columns.clone()));
    }
}

#[test]
fn truncate_after_removes_exactly_the_later_parts() {
    let out = tempfile::tempdir().unwrap();
    let log = RolloutLog::open(out.path()).unwrap();
    for step in 0..6 {
        log.append(step, &rows(step, 2, 2)).unwrap();
    }
    assert_eq!(log.truncate_after(2).unwrap(), 3);
    assert_eq!(
        part_names(log.dir()),
        ["step-000000.parquet", "step-000001.parquet", "step-000002.parquet"]
    );
    let back = read_rollouts(log.dir()).unwrap();
    assert_eq!(back.len(), 12);
    assert!(back.iter().all(|r| r.step <= 2));

    // Nothing after the last step: nothing removed.
    assert_eq!(log.truncate_after(2).unwrap(), 0);
    assert_eq!(log.truncate_after(100).unwrap(), 0);
    assert_eq!(read_rollouts(log.dir()).unwrap().len(), 12);

    // The resumed run writes step 3 again, and reopening keeps the parts.
    log.append(3, &rows(3, 1, 1)).unwrap();
    let reopened = RolloutLog::open(out.path()).unwrap();
    assert_eq!(read_rollouts(reopened.dir()).unwrap().len(), 13);

    // From before the first step: everything goes.
    assert_eq!(reopened.truncate_after(0).unwrap(), 3);
    assert_eq!(part_names(log.dir()), ["step-000000.parquet"]);
}

#[test]
fn a_crash_leftover_temp_file_is_skipped_and_then_removed() {
    let out = tempfile::tempdir().unwrap();
    let log = RolloutLog::open(out.path()).unwrap();
    log.append(0, &rows(0, 1, 2)).unwrap();
    log.append(1, &rows(1, 1, 2)).unwrap();
    // What a crash mid-write of step 2 leaves: a torn hidden temp file.
    let tmp: PathBuf = log.dir().join(".step-000002.parquet.tmp");
    std::fs::write(&tmp, b"PAR1 torn").unwrap();

    assert_eq!(read_rollouts(log.dir()).unwrap().len(), 4);
    // Step 2 can still be written (its temp name is reused).
    log.append(2, &rows(2, 1, 2)).unwrap();
    std::fs::write(&tmp, b"PAR1 torn again").unwrap();
    assert_eq!(read_rollouts(log.dir()).unwrap().len(), 6);

    // Truncating counts parts only, and clears the temp file.
    assert_eq!(log.truncate_after(1).unwrap(), 1);
    assert!(!tmp.exists());
    assert_eq!(part_names(log.dir()), ["step-000000.parquet", "step-000001.parquet"]);
}

#[test]
fn append_leaves_no_temp_file_behind() {
    let out = tempfile::tempdir().unwrap();
    let log = RolloutLog::open(out.path()).unwrap();
    log.append(4, &rows(4, 2, 2)).unwrap();
    log.append(5, &[]).unwrap();
    assert_eq!(part_names(log.dir()), ["step-000004.parquet", "step-000005.parquet"]);
    assert_eq!(num_rows(&log.part_path(5)), 0);
    assert_eq!(read_rollouts(log.dir()).unwrap().len(), 4);
}

#[test]
fn bad_appends_are_refused_without_touching_the_log() {
    let out = tempfile::tempdir().unwrap();
    let log = RolloutLog::open(out.path()).unwrap();
    log.append(3, &rows(3, 1, 2)).unwrap();

    // A step's part is written once.
    let err = log.append(3, &rows(3, 1, 1)).unwrap_err();
    assert!(
        matches!(&err, Error::Data { path, .. } if path.ends_with("step-000003.parquet")),
        "{err}"
    );
    assert!(err.to_string().contains("already exists"), "{err}");

    // Rows of another step in a step's part.
    let mut mixed = rows(4, 1, 3);
    mixed[2].step = 9;
    let err = log.append(4, &mixed).unwrap_err();
    assert!(matches!(&err, Error::Data { line: 3, .. }), "{err}");

    assert_eq!(part_names(log.dir()), ["step-000003.parquet"]);
    assert_eq!(read_rollouts(log.dir()).unwrap(), rows(3, 1, 2));
}

#[test]
fn a_corrupt_or_foreign_part_errors_naming_it() {
    let out = tempfile::tempdir().unwrap();
    let log = RolloutLog::open(out.path()).unwrap();
    log.append(0, &rows(0, 1, 1)).unwrap();

    // Garbage under a part's name.
    let bad = log.dir().join("step-000001.parquet");
    std::fs::write(&bad, b"not parquet at all").unwrap();
    let err = read_rollouts(log.dir()).unwrap_err();
    assert!(
        matches!(&err, Error::Data { path, line: 0, .. } if *path == bad),
        "{err}"
    );
    std::fs::remove_file(&bad).unwrap();

    // A part of step 2 that holds rows of step 0 (copied in by hand).
    std::fs::copy(log.part_path(0), log.dir().join("step-000002.parquet")).unwrap();
    let err = read_rollouts(log.dir()).unwrap_err();
    assert!(matches!(&err, Error::Data { line: 1, .. }), "{err}");
    assert!(err.to_string().contains("step-000002.parquet"), "{err}");

    // Not a log folder at all.
    let err = read_rollouts(&out.path().join("missing")).unwrap_err();
    assert!(matches!(&err, Error::Data { line: 0, .. }), "{err}");
}

/// pandas and pyarrow (the test venv's, `tools/test_python.rs`) read the
/// folder as one dataset.
#[test]
fn pandas_reads_the_dataset_folder() {
    let python = test_python::test_python();
    let out = tempfile::tempdir().unwrap();
    let log = RolloutLog::open(out.path()).unwrap();
    let written: Vec<RolloutRow> = (0..3).flat_map(|s| rows(s, 2, 2)).collect();
    for step in 0..3 {
        log.append(step, &rows(step, 2, 2)).unwrap();
    }
    std::fs::write(log.dir().join(".step-000003.parquet.tmp"), b"torn").unwrap();
    let script = r#"
import json, sys, math
import pandas as pd, pyarrow.dataset as ds
df = pd.read_parquet(sys.argv[1])
assert ds.dataset(sys.argv[1]).count_rows() == len(df)
df = df.sort_values(["step", "group", "sample"], kind="stable")
rows = []
for r in df.to_dict("records"):
    rows.append({k: (None if isinstance(v, float) and math.isnan(v) else (v.tolist() if hasattr(v, "tolist") else v)) for k, v in r.items()})
print(json.dumps(rows))
"#;
    let output = std::process::Command::new(python)
        .arg("-c")
        .arg(script)
        .arg(log.dir())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let got: Vec<serde_json::Value> = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(got.len(), written.len());
    for (g, w) in got.iter().zip(&written) {
        assert_eq!(g["step"], w.step);
        assert_eq!(g["policy_version"], w.policy_version);
        assert_eq!(g["group"], w.group);
        assert_eq!(g["sample"], w.sample);
        assert_eq!(g["prompt"], w.prompt.as_str());
        assert_eq!(g["completion"], w.completion.as_str());
        assert_eq!(g["reward"].as_f64().map(|r| r as f32), w.reward);
        assert_eq!(g["advantage"].as_f64().unwrap() as f32, w.advantage);
        assert_eq!(g["completion_tokens"], w.completion_tokens);
        assert_eq!(g["finish_reason"], w.finish_reason.as_str());
        assert_eq!(g["columns"], w.columns.as_str());
        match &w.episode {
            None => {
                for column in [
                    "messages",
                    "token_ids",
                    "loss_mask",
                    "turns",
                    "tool_calls",
                    "episode_end",
                ] {
                    assert!(g[column].is_null(), "{column}: {}", g[column]);
                }
            }
            Some(e) => {
                assert_eq!(g["messages"], e.messages.as_str());
                assert_eq!(g["token_ids"], serde_json::json!(e.token_ids));
                assert_eq!(g["loss_mask"], serde_json::json!(e.loss_mask));
                // pandas reads a u32 column with nulls as floats.
                assert_eq!(g["turns"].as_f64(), Some(f64::from(e.turns)));
                assert_eq!(g["tool_calls"].as_f64(), Some(f64::from(e.tool_calls)));
                assert_eq!(g["episode_end"], e.end.as_str());
            }
        }
    }
}
