//! The run config's documentation stays true: examples/reference.toml,
//! which lists every key with its default, parses to exactly the config of
//! the two required keys alone, and its reward tables build.

use std::path::Path;

use grpo_learner::config::RunConfig;

#[test]
fn the_reference_config_lists_the_defaults() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/reference.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let reference = RunConfig::from_toml_str(&text).unwrap();
    let minimal = RunConfig::from_toml_str(
        "[model]\nname = \"smollm2-135m-instruct\"\n[data]\npath = \"arithmetic/data.jsonl\"\n",
    )
    .unwrap();
    assert_eq!(format!("{reference:#?}"), format!("{minimal:#?}"));
    let rewards = grpo_reward::RewardsConfig::from_toml_str(&text).unwrap();
    rewards.build(&grpo_reward::Registry::default()).unwrap();
}

#[test]
fn invalid_values_name_their_key() {
    let base = "[model]\nname = \"m\"\n[data]\npath = \"d.jsonl\"\n";
    for (extra, key) in [
        ("[rollout]\ngroup_size = 1\n", "rollout.group_size"),
        ("[rollout]\nweight_dtype = \"f16\"\n", "rollout.weight_dtype"),
        ("[checkpoint]\nevery = -1\n", "checkpoint.every"),
        ("[trainer]\nevals = 3\n", "evals"),
        ("[optimizer]\nschedule = \"step\"\n", "optimizer.schedule"),
    ] {
        let err = RunConfig::from_toml_str(&format!("{base}{extra}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{extra}: {err}");
    }
}
