//! The run config's documentation stays true: examples/reference.toml,
//! which lists every key with its default, parses to exactly the config of
//! the two required keys alone, and its reward tables build.

use std::path::Path;

use grpo_learner::config::{ConfigFile, ParallelismKind, RunConfig};
use grpo_learner::fleet::FleetPlan;

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
        (
            "[rollout]\nlisten = \"0.0.0.0:1\"\ntls_cert = \"c.pem\"\n",
            "rollout.tls_key",
        ),
        (
            "[rollout]\nlisten = \"0.0.0.0:1\"\ntls_key = \"k.pem\"\n",
            "rollout.tls_cert",
        ),
        (
            "[rollout]\ntls_cert = \"c.pem\"\ntls_key = \"k.pem\"\n",
            "rollout.tls_cert",
        ),
        ("[rollout]\ntls_ca = 3\n", "rollout.tls_ca"),
        (
            "[optimizer]\nwarmup_steps = 5\nwarmup_ratio = 0.1\n",
            "optimizer.warmup_ratio",
        ),
        ("[optimizer]\nadam_beta2 = 1.0\n", "optimizer.beta2"),
        ("[rollout]\ntop_p = 0.0\n", "rollout.top_p"),
        ("[rollout]\nrepetition_penalty = 0.0\n", "rollout.repetition_penalty"),
        (
            "[rollout]\nstructured_outputs = { regex = 3 }\n",
            "rollout.structured_outputs",
        ),
        (
            "[rollout.structured_outputs]\nregex = \"a\"\nchoice = [\"b\"]\n",
            "rollout.structured_outputs",
        ),
        (
            "[rollout.structured_outputs]\nstructural_tag = \"t\"\n",
            "rollout.structured_outputs",
        ),
        ("[lora]\ndropout = 1.0\n", "lora.dropout"),
        ("[lora]\ntarget_modules = []\n", "lora.target_modules"),
        ("[lora]\ntarget_modules = 3\n", "lora.target_modules"),
        ("[lora]\nuse_dora = true\n", "use_dora"),
        ("[lora]\nr = 4\nrank = 8\n", "rank"),
        ("[lora]\nbase_dtype = \"f16\"\n", "lora.base_dtype"),
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
            .map(|config| FleetPlan::of(&config.rollout))
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
fn a_chat_template_file_is_relative_to_the_config() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    let text = "[model]\nname = \"m\"\nchat_template = \"tools.jinja\"\n[data]\npath = \"d.jsonl\"\n";
    std::fs::write(&path, text).unwrap();
    let config = RunConfig::from_file(&path).unwrap();
    assert_eq!(config.model.chat_template, Some(dir.path().join("tools.jinja")));
    std::fs::write(&path, "[model]\nname = \"m\"\n[data]\npath = \"d.jsonl\"\n").unwrap();
    assert_eq!(RunConfig::from_file(&path).unwrap().model.chat_template, None);
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
    assert!(turns[1].text().starts_with("Natalia sold clips"));

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
    use grpo_xla::trace::Parallelism;
    assert_eq!(ParallelismKind::None.layout(0, 4).unwrap(), None);
    assert_eq!(
        ParallelismKind::Data.layout(0, 4).unwrap(),
        Some(Parallelism::DataParallel { devices: 4 }),
        "0 devices: all the client's"
    );
    assert_eq!(
        ParallelismKind::Fsdp.layout(2, 4).unwrap(),
        Some(Parallelism::Fsdp { devices: 2 })
    );
    for (kind, devices, available) in [
        (ParallelismKind::Fsdp, 0, 1),
        (ParallelismKind::Data, 5, 4),
        (ParallelismKind::Fsdp, 1, 4),
    ] {
        let err = kind.layout(devices, available).unwrap_err().to_string();
        assert!(
            err.contains("trainer.devices"),
            "{kind:?} over {devices} of {available}: {err}"
        );
    }
}

#[test]
fn trl_names_are_aliases_and_both_names_at_once_are_refused() {
    let base = "[model]\nname = \"m\"\n[data]\npath = \"d.jsonl\"\n";
    let ours = "[rollout]\ngroup_size = 4\nmax_completion_tokens = 64\n[optimizer]\nlr = 2e-5\nschedule = \"cosine\"\n\
                beta1 = 0.8\nbeta2 = 0.99\neps = 1e-6\n\
                [trainer]\nmicro_batch_size = 8\neval_every = 5\n[checkpoint]\nevery = 7\nkeep_last = 2\n\
                [logging]\nout = \"o\"\n";
    let trl = "[rollout]\nnum_generations = 4\nmax_completion_length = 64\n\
               [optimizer]\nlearning_rate = 2e-5\nlr_scheduler_type = \"cosine\"\n\
               adam_beta1 = 0.8\nadam_beta2 = 0.99\nadam_epsilon = 1e-6\n\
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

/// The extreme values every numeric key is fed.
const EXTREMES: [&str; 5] = ["0", "-1", "nan", "inf", "1e30"];

/// The `(section, key)` of every number in `table`'s sections.
fn numeric_keys(table: &toml::Table) -> Vec<(String, String)> {
    let mut keys = Vec::new();
    for (section, value) in table {
        if let toml::Value::Table(fields) = value {
            for (key, value) in fields {
                if matches!(value, toml::Value::Integer(_) | toml::Value::Float(_)) {
                    keys.push((section.clone(), key.clone()));
                }
            }
        }
    }
    keys
}

/// What reading `text` with `read` did: `None` when it took it, else the
/// error (a panic is an error saying so).
fn outcome(read: impl Fn() -> Result<(), String> + std::panic::UnwindSafe) -> Option<String> {
    match std::panic::catch_unwind(read) {
        Ok(Ok(())) => None,
        Ok(Err(message)) => Some(message),
        Err(_) => Some("PANICKED".to_string()),
    }
}

/// Feeds every numeric key of the config file at `path` (plus `optional`
/// keys it leaves out; not those of tables another parser reads) each of
/// [`EXTREMES`]; returns the refusals that do
/// not name their key and the values taken.
fn sweep<C: ConfigFile>(path: &str, optional: &[(&str, &str)]) -> (Vec<String>, Vec<String>) {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap();
    let mut keys = numeric_keys(&text.parse().unwrap());
    keys.retain(|(section, _)| !C::FOREIGN_TABLES.contains(&section.as_str()));
    keys.extend(optional.iter().map(|(s, k)| (s.to_string(), k.to_string())));
    let (mut bad, mut taken) = (Vec::new(), Vec::new());
    for (section, key) in keys {
        for value in EXTREMES {
            let setting = format!("{section}.{key}={value}");
            let edited = grpo_learner::config::with_overrides(&text, std::slice::from_ref(&setting)).unwrap();
            match outcome(|| C::from_toml_str(&edited).map(drop).map_err(|e| e.to_string())) {
                None => taken.push(setting),
                Some(error) if error.contains(&format!("{section}.{key}")) => {}
                Some(error) => bad.push(format!("{setting}: {error}")),
            }
        }
    }
    (bad, taken)
}

#[test]
fn every_numeric_key_takes_or_refuses_extreme_values_naming_the_key() {
    let (bad, taken) = sweep::<RunConfig>(
        "../examples/reference.toml",
        &[
            ("algorithm", "epsilon_high"),
            ("trainer", "max_steps"),
            ("trainer", "num_train_epochs"),
            LORA_KEYS[0],
            LORA_KEYS[1],
            LORA_KEYS[2],
            LORA_KEYS[3],
        ],
    );
    assert!(
        bad.is_empty(),
        "refused without naming the key, or panicked:\n{}",
        bad.join("\n")
    );
    // Zero where it means "none", "never", "all" or a seed; nothing else
    // (in the keys' order).
    assert_eq!(
        taken,
        [
            "algorithm.beta=0",
            "checkpoint.every=0",
            "checkpoint.keep_last=0",
            "data.eval_size=0",
            "data.seed=0",
            "optimizer.beta1=0",
            "optimizer.beta2=0",
            "optimizer.max_grad_norm=0",
            "optimizer.warmup_ratio=0",
            "optimizer.warmup_steps=0",
            "optimizer.weight_decay=0",
            "rollout.max_staleness=0",
            "rollout.min_p=0",
            "rollout.seed=0",
            "rollout.top_k=0",
            "trainer.devices=0",
            "trainer.eval_every=0",
            "trainer.max_steps=0",
            "lora.dropout=0",
            "lora.seed=0",
        ]
    );
}

/// The numeric keys of the optional `[lora]` section.
const LORA_KEYS: [(&str, &str); 4] = [
    ("lora", "rank"),
    ("lora", "alpha"),
    ("lora", "dropout"),
    ("lora", "seed"),
];

#[test]
fn every_numeric_key_of_sft_takes_or_refuses_extreme_values_naming_the_key() {
    use grpo_learner::config::sft::SftRunConfig;
    let (bad, taken) = sweep::<SftRunConfig>("../examples/sft/config.toml", &LORA_KEYS);
    assert!(
        bad.is_empty(),
        "refused without naming the key, or panicked:\n{}",
        bad.join("\n")
    );
    assert_eq!(
        taken,
        [
            "checkpoint.every=0",
            "checkpoint.keep_last=0",
            "data.eval_size=0",
            "data.seed=0",
            "optimizer.max_grad_norm=0",
            "optimizer.warmup_steps=0",
            "optimizer.weight_decay=0",
            "trainer.devices=0",
            "trainer.eval_every=0",
            "trainer.max_steps=0",
            "lora.dropout=0",
            "lora.seed=0",
        ]
    );
}

#[test]
fn every_numeric_reward_key_takes_or_refuses_extreme_values_naming_it() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/reference.toml");
    let table: toml::Table = std::fs::read_to_string(path).unwrap().parse().unwrap();
    let mut taken = Vec::new();
    for key in ["weight", "timeout_s", "on_error", "concurrency"] {
        for value in EXTREMES {
            let mut edited = table.clone();
            let number: toml::Value = format!("v = {value}").parse::<toml::Table>().unwrap()["v"].clone();
            match key {
                "concurrency" => edited["reward_pool"].as_table_mut().unwrap().insert(key.into(), number),
                _ => edited["reward"].as_array_mut().unwrap()[0]
                    .as_table_mut()
                    .unwrap()
                    .insert(key.into(), number),
            };
            let text = toml::to_string(&edited).unwrap();
            let read = || {
                let config = grpo_reward::RewardsConfig::from_toml_str(&text).map_err(|e| e.to_string())?;
                config
                    .build(&grpo_reward::Registry::default())
                    .map(drop)
                    .map_err(|e| e.to_string())
            };
            match outcome(read) {
                None => taken.push(format!("{key}={value}")),
                Some(error) => assert!(error.contains(key), "{key} = {value}: {error}"),
            }
        }
    }
    assert_eq!(
        taken,
        [
            "weight=0",
            "weight=-1",
            "weight=1e30",
            "on_error=0",
            "on_error=-1",
            "on_error=1e30"
        ]
    );
}

#[test]
fn reward_weights_is_the_entries_weights_in_order() {
    let two = "[[reward]]\ntype = \"math\"\n[[reward]]\ntype = \"length\"\nmax_tokens = 10\n";
    let read = |pool: &str| grpo_reward::RewardsConfig::from_toml_str(&format!("{pool}{two}"));
    let weights = read("[reward_pool]\nreward_weights = [0.5, 2.0]\n").unwrap();
    let weights: Vec<f32> = weights.rewards.iter().map(|r| r.weight).collect();
    assert_eq!(weights, [0.5, 2.0]);
    let short = read("[reward_pool]\nreward_weights = [0.5]\n").unwrap_err().to_string();
    assert!(short.contains("reward_weights has 1 weights for 2"), "{short}");
    let both = grpo_reward::RewardsConfig::from_toml_str(
        "[reward_pool]\nreward_weights = [1.0]\n[[reward]]\ntype = \"math\"\nweight = 2.0\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        both.contains("both `weight` and [reward_pool] reward_weights"),
        "{both}"
    );
}

#[test]
fn the_optimizer_and_rollout_knobs_reach_what_they_set() {
    let text = "[model]\nname = \"m\"\n[data]\npath = \"d.jsonl\"\n[trainer]\nmax_steps = 25\n\
                [optimizer]\nwarmup_ratio = 0.1\nbeta1 = 0.8\nbeta2 = 0.95\neps = 1e-6\n\
                [rollout]\ntop_p = 0.9\ntop_k = 20\nmin_p = 0.05\nrepetition_penalty = 1.1\n";
    let config = RunConfig::from_toml_str(text).unwrap();
    // transformers rounds the warm-up up: ⌈0.1 · 25⌉ = 3 steps.
    assert_eq!(config.optimizer.schedule(25).warmup, 3);
    let adamw = config.optimizer.adamw();
    assert_eq!((adamw.beta1, adamw.beta2, adamw.eps), (0.8, 0.95, 1e-6));
    let grpo = grpo_learner::grpo::GrpoConfig::of(&config, 25, grpo_learner::choices::Choices::F32);
    let f = grpo.filters;
    assert_eq!((f.top_p, f.top_k, f.min_p, f.repetition_penalty), (0.9, 20, 0.05, 1.1));
}

#[test]
fn num_train_epochs_counts_steps_unless_max_steps_is_given() {
    let base = "[model]\nname = \"m\"\n[data]\npath = \"d.jsonl\"\n[rollout]\nprompts_per_step = 16\n";
    let steps = |trainer: &str| {
        RunConfig::from_toml_str(&format!("{base}[trainer]\n{trainer}")).map(|c| c.trainer.steps(100, 16))
    };
    // As the Hugging Face trainer: passes over the prompts, rounded up; a given max_steps wins.
    assert_eq!(steps("").unwrap(), 100);
    assert_eq!(steps("num_train_epochs = 2").unwrap(), 13);
    assert_eq!(steps("num_train_epochs = 0.5").unwrap(), 4);
    assert_eq!(steps("num_train_epochs = 2\nmax_steps = 3").unwrap(), 3);
    assert_eq!(steps("max_steps = 0").unwrap(), 0);
    for bad in [
        "num_train_epochs = 0",
        "num_train_epochs = -1",
        "num_train_epochs = nan",
        "num_train_epochs = 1e9",
    ] {
        let error = steps(bad).unwrap_err().to_string();
        assert!(error.contains("trainer.num_train_epochs"), "{bad}: {error}");
    }
    let sft = "[model]\nname = \"m\"\n[data]\npath = \"d.jsonl\"\n[trainer]\nbatch_size = 8\nnum_train_epochs = 3\n";
    let sft = grpo_learner::config::sft::SftRunConfig::from_toml_str(sft).unwrap();
    assert_eq!(sft.trainer.steps(20), 8, "⌈3 · 20 / 8⌉");
}

#[test]
fn max_shard_size_reads_as_transformers_reads_it() {
    let base = "[model]\nname = \"m\"\n[data]\npath = \"d.jsonl\"\n[checkpoint]\n";
    let bytes = |size: &str| {
        RunConfig::from_toml_str(&format!("{base}max_shard_size = {size}\n"))
            .and_then(|c| c.checkpoint.save_options())
            .map(|o| o.max_shard_bytes)
    };
    assert_eq!(bytes("\"5GB\"").unwrap(), 5_000_000_000);
    assert_eq!(bytes("\"500MB\"").unwrap(), 500_000_000);
    assert_eq!(bytes("\"2GiB\"").unwrap(), 2 << 30);
    assert_eq!(bytes("\"1.5 kb\"").unwrap(), 1500);
    assert_eq!(bytes("1000").unwrap(), 1000);
    for bad in ["0", "-5", "\"5 parsecs\"", "\"GB\"", "\"nan GB\"", "true"] {
        let error = bytes(bad).unwrap_err().to_string();
        assert!(error.contains("checkpoint.max_shard_size"), "{bad}: {error}");
    }
    let bf16 = RunConfig::from_toml_str(&format!("{base}save_dtype = \"bf16\"\n")).unwrap();
    assert_eq!(
        bf16.checkpoint.save_options().unwrap().dtype,
        grpo_model::weights::SaveDtype::Bf16
    );
    assert!(RunConfig::from_toml_str(&format!("{base}save_dtype = \"f16\"\n")).is_err());
}

#[test]
fn activation_checkpointing_reads_its_names_and_trls_flag() {
    use grpo_learner::config::ActivationCheckpointing;
    let base = "[model]\nname = \"m\"\n[data]\npath = \"d.jsonl\"\n[trainer]\n";
    let read =
        |line: &str| RunConfig::from_toml_str(&format!("{base}{line}\n")).map(|c| c.trainer.activation_checkpointing);
    assert_eq!(read("").unwrap(), ActivationCheckpointing::None);
    assert_eq!(
        read("activation_checkpointing = \"layer\"").unwrap(),
        ActivationCheckpointing::Layer
    );
    assert_eq!(
        read("activation_checkpointing = \"none\"").unwrap(),
        ActivationCheckpointing::None
    );
    assert_eq!(
        read("gradient_checkpointing = true").unwrap(),
        ActivationCheckpointing::Layer
    );
    assert_eq!(
        read("gradient_checkpointing = false").unwrap(),
        ActivationCheckpointing::None
    );
    for bad in ["activation_checkpointing = \"block\"", "activation_checkpointing = 2"] {
        let error = read(bad).unwrap_err().to_string();
        assert!(error.contains("trainer.activation_checkpointing"), "{bad}: {error}");
    }
    let sft = "[model]\nname = \"m\"\n[data]\npath = \"d.jsonl\"\n[trainer]\ngradient_checkpointing = true\n";
    let sft = grpo_learner::config::sft::SftRunConfig::from_toml_str(sft).unwrap();
    assert!(sft.trainer.activation_checkpointing.per_layer());
}
