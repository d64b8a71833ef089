//! The run config's documentation stays true: examples/reference.toml,
//! which lists every key with its default, parses to exactly the config of
//! the two required keys alone, and its reward tables build.

use std::path::Path;

use grpo_learner::config::{ConfigFile, RunConfig};

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
        ("[rollout]\ntemperature = 0.0\n", "rollout.temperature"),
        ("[rollout]\nweight_dtype = \"f16\"\n", "rollout.weight_dtype"),
        ("[checkpoint]\nevery = -1\n", "checkpoint.every"),
        ("[trainer]\nevals = 3\n", "evals"),
        ("[optimizer]\nschedule = \"step\"\n", "optimizer.schedule"),
        ("[rollout]\nlisten = \"localhost\"\n", "rollout.listen"),
        ("[rollout]\nin_process = false\n", "rollout.in_process"),
        ("[rollout]\nheartbeat_s = 0.0\n", "rollout.heartbeat_s"),
        ("[rollout]\nworker_timeout_s = -1.0\n", "rollout.worker_timeout_s"),
        ("[rollout]\nworker_wait_s = nan\n", "rollout.worker_wait_s"),
        ("[rollout]\nengines = 0\n", "rollout.engines"),
        ("[rollout]\nengines = 2\nworkers = [\"h:1\"]\n", "rollout.engines"),
        ("[trainer]\nparallelism = \"tensor\"\n", "trainer.parallelism"),
    ] {
        let err = RunConfig::from_toml_str(&format!("{base}{extra}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{extra}: {err}");
    }
}

#[test]
fn the_fleet_is_the_in_process_engine_unless_workers_or_a_registry_are_given() {
    let base = "[model]\nname = \"m\"\n[data]\npath = \"d.jsonl\"\n";
    let plan = |rollout: &str| {
        RunConfig::from_toml_str(&format!("{base}[rollout]\n{rollout}"))
            .unwrap()
            .fleet()
            .unwrap()
    };
    let alone = plan("");
    assert!(alone.local_only() && alone.in_process);
    let two = plan("engines = 2\n");
    assert!(!two.local_only() && two.in_process && two.engines == 2);
    let listed = plan("workers = [\"10.0.0.2:50051\"]\n");
    assert!(!listed.local_only() && !listed.in_process);
    let both = plan("listen = \"0.0.0.0:50050\"\nin_process = true\nheartbeat_s = 0.5\n");
    assert_eq!(both.listen, Some("0.0.0.0:50050".parse().unwrap()));
    assert!(both.in_process && !both.local_only());
    assert_eq!(both.config.heartbeat, std::time::Duration::from_millis(500));
}

#[test]
fn the_gsm8k_example_reads_chat_prompts_and_scores_reference_solutions() {
    use grpo_learner::data::Prompt;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/gsm8k/config.toml");
    let config = RunConfig::from_file(&path).unwrap();
    let (train, eval) = config.data.load().unwrap();
    assert_eq!((train.len(), eval.len()), (200, 100));
    let Prompt::Chat(turns) = &train[0].prompt else {
        panic!("as_chat makes chat prompts")
    };
    let roles: Vec<&str> = turns.iter().map(|t| t.role.as_str()).collect();
    assert_eq!(roles, ["system", "user"]);
    assert!(turns[1].content.starts_with("Natalia sold clips"));

    let text = std::fs::read_to_string(&path).unwrap();
    let pool = grpo_reward::RewardsConfig::from_toml_str(&text)
        .unwrap()
        .build(&grpo_reward::Registry::default())
        .unwrap();
    let samples: Vec<grpo_reward::Sample> = eval
        .iter()
        .take(20)
        .enumerate()
        .flat_map(|(i, row)| {
            let solution = row.columns["answer"].as_str().unwrap().to_string();
            let wrong = format!("{}\n#### 1234567", solution.rsplit_once("####").unwrap().0);
            [solution, wrong].map(|completion| grpo_reward::Sample {
                id: i as u64,
                group_id: i as u64,
                prompt: String::new(),
                messages: Vec::new(),
                completion,
                completion_ids: Vec::new(),
                row: row.columns.clone(),
            })
        })
        .collect();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let totals = runtime.block_on(pool.score(&samples)).unwrap();
    for (pair, sample) in totals.chunks(2).zip(samples.chunks(2)) {
        assert_eq!(
            pair[0].reward,
            Some(1.0),
            "the reference solution: {}",
            sample[0].completion
        );
        assert_eq!(pair[1].reward, Some(0.0), "a wrong final number");
    }
}

#[test]
fn the_learner_spans_the_devices_its_parallelism_asks_for() {
    use grpo_learner::config::learner_parallelism;
    use grpo_xla::trace::Parallelism;
    assert_eq!(learner_parallelism("none", 0, 4).unwrap(), None);
    assert_eq!(
        learner_parallelism("data", 0, 4).unwrap(),
        Some(Parallelism::DataParallel { devices: 4 }),
        "0 devices: all the client's"
    );
    assert_eq!(
        learner_parallelism("fsdp", 2, 4).unwrap(),
        Some(Parallelism::Fsdp { devices: 2 })
    );
    for (kind, devices, available, key) in [
        ("fsdp", 0, 1, "trainer.devices"),
        ("data", 5, 4, "trainer.devices"),
        ("fsdp", 1, 4, "trainer.devices"),
        ("zero3", 2, 4, "trainer.parallelism"),
    ] {
        let err = learner_parallelism(kind, devices, available).unwrap_err().to_string();
        assert!(err.contains(key), "{kind} over {devices} of {available}: {err}");
    }
}

#[test]
fn trl_names_are_aliases_and_both_names_at_once_are_refused() {
    let base = "[model]\nname = \"m\"\n[data]\npath = \"d.jsonl\"\n";
    let ours = "[rollout]\ngroup_size = 4\nmax_completion_tokens = 64\n[optimizer]\nlr = 2e-5\nschedule = \"cosine\"\n\
                [trainer]\nmicro_batch_size = 8\neval_every = 5\n[checkpoint]\nevery = 7\nkeep_last = 2\n\
                [logging]\nout = \"o\"\n";
    let trl = "[rollout]\nnum_generations = 4\nmax_completion_length = 64\n\
               [optimizer]\nlearning_rate = 2e-5\nlr_scheduler_type = \"cosine\"\n\
               [trainer]\nper_device_train_batch_size = 8\neval_steps = 5\n\
               [checkpoint]\nsave_steps = 7\nsave_total_limit = 2\n[logging]\noutput_dir = \"o\"\n";
    let parse = |extra: &str| RunConfig::from_toml_str(&format!("{base}{extra}"));
    assert_eq!(
        format!("{:#?}", parse(trl).unwrap()),
        format!("{:#?}", parse(ours).unwrap())
    );
    let both = parse("[rollout]\ngroup_size = 4\nnum_generations = 4\n")
        .unwrap_err()
        .to_string();
    assert!(both.contains("duplicate field `group_size`"), "{both}");
}
