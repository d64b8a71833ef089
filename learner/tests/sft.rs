//! The SFT step on a tiny fixture model (real CPU plugin): its loss equals
//! the mean NLL of the trained completion tokens by the separate log-prob
//! program (prompts of different lengths, so rows are left-padded
//! differently; context tokens inside completions not trained on); multi-turn
//! chat completions train on the assistant's turns only; two
//! micro-batches update the parameters as one whole batch does; a few dozen
//! steps on a tiny set memorise it; data-parallel and FSDP loops over two
//! devices match the one-device loop; the config refuses unknown keys.

mod common;

use std::path::Path;
use std::sync::Arc;

use grpo_env::toolbox::ToolFunction;
use grpo_learner::collect::PromptEncoder;
use grpo_learner::config::sft::SftRunConfig;
use grpo_learner::config::{ConfigFile, with_overrides};
use grpo_learner::data::{Example, Prompt};
use grpo_learner::learner::{Learner, Optimization};
use grpo_learner::objective::sft::SftObjective;
use grpo_learner::schedule::{Decay, Schedule};
use grpo_learner::sft::{
    SftConfig, SftExample, SftParts, SftReport, SftTask, encode_examples, pack_examples, upload_batch,
};
use grpo_learner::trainer::Trainer;
use grpo_model::config::ModelConfig;
use grpo_model::decoder::Decoder;
use grpo_model::load::upload_parameters;
use grpo_model::logprobs::LogprobsRunner;
use grpo_model::tokenizer::Tokenizer;
use grpo_model::weights::Safetensors;
use grpo_xla::trace::{AdamW, Mesh, Parallelism};
use grpo_xla::{Buffer, Client, ClientOptions, ElementType, Platform};

fn client_of(devices: usize) -> Client {
    Client::for_platform(
        Platform::Cpu,
        ClientOptions::default()
            .compile_cache_dir(None)
            .cpu_device_count(devices),
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

fn client() -> Client {
    client_of(1)
}

/// The mean completion NLL of `data` under a learner's weights.
fn learner_nll(runner: &LogprobsRunner, learner: &Learner<SftObjective>, data: &[SftExample]) -> f64 {
    learner
        .with_params_on_one_device(|params| Ok(host_nll(runner, params, data)))
        .unwrap()
}

fn fixtures() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures")
}

fn fixture() -> (Decoder, Safetensors) {
    let dir = fixtures().join("parity/llama");
    let config = ModelConfig::from_file(dir.join("config.json")).unwrap();
    (Decoder::new(config), Safetensors::open_dir(&dir).unwrap())
}

/// Four pairs: prompts of 4, 2, 5 and 3 tokens, completions of 6, 3, 5, 2;
/// the first and third completions have tokens that are context, not
/// trained on (as a tool's result between two assistant turns): 13 trained.
fn examples() -> Vec<SftExample> {
    let prompts = [4, 2, 5, 3];
    let completions = [6, 3, 5, 2];
    let context: [&[usize]; 4] = [&[3], &[], &[1, 2], &[]];
    (0..4)
        .map(|i| SftExample {
            prompt: (0..prompts[i]).map(|j| ((i * 13 + j * 5) % 100 + 3) as u32).collect(),
            completion: (0..completions[i])
                .map(|j| ((i * 31 + j * 7) % 120 + 1) as u32)
                .collect(),
            loss_mask: (0..completions[i]).map(|j| !context[i].contains(&j)).collect(),
        })
        .collect()
}

/// Mean NLL of `examples`' trained completion tokens under `params`, from the log-prob program.
fn host_nll<B: std::borrow::Borrow<Buffer>>(runner: &LogprobsRunner, params: &[B], examples: &[SftExample]) -> f64 {
    let ids: Vec<Vec<u32>> = examples
        .iter()
        .map(|e| [e.prompt.clone(), e.completion.clone()].concat())
        .collect();
    let stats = runner.run(params, &ids).unwrap();
    let (mut nll, mut tokens) = (0.0, 0);
    for (e, s) in examples.iter().zip(&stats) {
        let first = e.prompt.len() - 1;
        for (&x, &trained) in s.logprobs[first..first + e.completion.len()].iter().zip(&e.loss_mask) {
            if trained {
                nll -= f64::from(x);
                tokens += 1;
            }
        }
    }
    nll / tokens as f64
}

#[test]
fn the_sft_loss_is_the_mean_completion_nll_and_micro_batches_match_the_whole() {
    let client = client();
    let (decoder, weights) = fixture();
    let device = client.device(0).unwrap();
    let params = || upload_parameters(&client, device, &decoder, &weights, ElementType::F32).unwrap();
    let runner = LogprobsRunner::new(&client, decoder.clone(), ElementType::F32);
    let data = examples();
    let want = host_nll(&runner, &params(), &data);

    let optimization = Optimization {
        optimizer: AdamW {
            weight_decay: 0.0,
            ..AdamW::default()
        },
        max_grad_norm: Some(1.0),
        compute: ElementType::F32,
    };
    let learner = || {
        let mesh = Mesh::single(device);
        Learner::new(&client, &decoder, mesh, SftObjective, optimization, params(), None).unwrap()
    };
    let packed = pack_examples(&data, 4, 64).unwrap();
    assert_eq!(packed.tokens, 13);
    assert_eq!(packed.normalizer, 13.0);
    let mut whole = learner();
    let inputs = upload_batch(&client, whole.mesh(), &packed).unwrap();
    let metrics = whole.train(packed.shape(), &inputs, 1e-2, 0).unwrap();
    let loss = f64::from(metrics.loss);
    assert!((loss - want).abs() < 1e-5 * want, "loss {loss} vs host {want}");
    assert!(
        (f64::from(metrics.metrics[0]) - want * 13.0).abs() < 1e-4 * want * 13.0,
        "NLL sum"
    );
    let after = learner_nll(&runner, &whole, &data);
    assert!(after < want, "one step lowers the NLL: {want} → {after}");

    // Two micro-batches of two rows: the same loss, norm and update.
    let halves = pack_examples(&data, 2, 64).unwrap();
    assert_eq!(halves.micro_batches.len(), 2);
    let mut micro = learner();
    let inputs = upload_batch(&client, micro.mesh(), &halves).unwrap();
    let micro_metrics = micro.train(halves.shape(), &inputs, 1e-2, 0).unwrap();
    assert!((f64::from(micro_metrics.loss) - loss).abs() < 1e-5 * loss);
    assert!((micro_metrics.grad_norm - metrics.grad_norm).abs() < 1e-4 * metrics.grad_norm.max(1.0));
    // AdamW's first step moves a weight by lr·g/(|g| + ε): where a gradient
    // is within rounding of ε, the order of the micro-batches' sums may move
    // it differently, so a rare weight (at most one in a thousand) may differ
    // by up to the step itself.
    for ((name, a), (_, b)) in whole.host_params().unwrap().iter().zip(micro.host_params().unwrap()) {
        let differing: Vec<f32> = a
            .data
            .iter()
            .zip(&b.data)
            .map(|(x, y)| (x - y).abs())
            .filter(|&d| d >= 1e-5)
            .collect();
        assert!(
            differing.len() * 1000 <= a.data.len() && differing.iter().all(|&d| d <= 1e-2),
            "{name}: {} of {} weights differ: {differing:?}",
            differing.len(),
            a.data.len()
        );
    }
}

/// The SFT loop's settings for the tiny set: 4 pairs per step in
/// micro-batches of 2, a warm-up then cosine decay over 30 steps.
fn tiny_set_config() -> SftConfig {
    SftConfig {
        batch_size: 4,
        micro_batch_rows: 2,
        max_length: 64,
        schedule: Schedule {
            lr: 1e-2,
            warmup: 2,
            total: 30,
            decay: Decay::Cosine,
        },
        optimizer: AdamW {
            weight_decay: 0.0,
            ..AdamW::default()
        },
        max_grad_norm: Some(1.0),
    }
}

/// The SFT trainer on the fixture model over the tiny set (held out too,
/// for the eval loss), on `parallelism` over a client of `devices` devices.
fn tiny_set_loop(devices: usize, parallelism: Option<Parallelism>) -> Trainer<SftTask> {
    let client = client_of(devices);
    let (decoder, weights) = fixture();
    let device = client.device(0).unwrap();
    let params = upload_parameters(&client, device, &decoder, &weights, ElementType::F32).unwrap();
    let parts = SftParts {
        mesh: Mesh::new(&client, parallelism).unwrap(),
        client,
        decoder,
        data: examples(),
        eval: examples(),
        data_seed: 3,
        params,
    };
    Trainer::sft(parts, tiny_set_config(), None).unwrap()
}

/// The next step's report.
fn step(sft: &mut Trainer<SftTask>) -> SftReport {
    serde_json::from_value(serde_json::Value::Object(sft.step().unwrap().metrics)).unwrap()
}

/// The eval loss and its token count.
fn eval(sft: &mut Trainer<SftTask>) -> (f64, u64) {
    let eval = sft.evaluate().unwrap().unwrap();
    (
        eval["eval_loss"].as_f64().unwrap(),
        eval["eval_tokens"].as_u64().unwrap(),
    )
}

#[test]
fn a_few_dozen_steps_memorise_a_tiny_set() {
    let mut sft = tiny_set_loop(1, None);
    let (before, tokens) = eval(&mut sft);
    let reports: Vec<_> = (0..30).map(|_| step(&mut sft)).collect();
    let (after, _) = eval(&mut sft);
    eprintln!(
        "eval loss {before:.3} → {after:.3}; train loss {:.3} → {:.3}",
        reports[0].loss, reports[29].loss
    );
    assert_eq!(tokens, 13);
    assert!(
        (f64::from(reports[0].loss) - before).abs() < 1e-4 * before,
        "the first step's loss is the eval loss of its (whole) batch"
    );
    assert!(after < 0.5 * before, "{before} → {after}");
    assert!(
        reports
            .iter()
            .all(|r| r.loss.is_finite() && r.grad_norm.is_finite() && r.tokens == 13)
    );
    assert_eq!(reports[29].step, 30);
    assert_eq!(sft.steps_done(), 30);
    assert_eq!(sft.learner().compiled_steps(), 1);
}

#[test]
fn data_parallel_and_fsdp_sft_loops_match_the_one_device_loop() {
    let steps = 5;
    let run = |devices, parallelism| {
        let mut sft = tiny_set_loop(devices, parallelism);
        let reports: Vec<_> = (0..steps).map(|_| step(&mut sft)).collect();
        let (eval, _) = eval(&mut sft);
        let bytes = sft.learner().state_bytes_per_device();
        (reports, eval, sft.host_params().unwrap(), bytes)
    };
    let (want, want_eval, want_params, whole) = run(1, None);
    for parallelism in [
        Parallelism::DataParallel { devices: 2 },
        Parallelism::Fsdp { devices: 2 },
    ] {
        let (reports, eval, params, per_device) = run(2, Some(parallelism));
        for (got, want) in reports.iter().zip(&want) {
            assert!(
                (got.loss - want.loss).abs() <= 1e-5 * want.loss,
                "{parallelism:?}: {got:?} vs {want:?}"
            );
            assert!((got.grad_norm - want.grad_norm).abs() <= 1e-4 * want.grad_norm);
        }
        assert!((eval - want_eval).abs() <= 1e-5 * want_eval);
        let worst = common::worst_relative_error(&params, &want_params);
        println!(
            "{parallelism:?}: worst parameter relative error after {steps} steps {worst:?}; bytes per device {per_device:?} (one device: {whole:?})"
        );
        assert!(worst.0 <= 1e-5, "{parallelism:?}: {worst:?}");
        match parallelism {
            Parallelism::DataParallel { .. } => assert_eq!(per_device, vec![whole[0]; 2]),
            Parallelism::Fsdp { .. } => assert!(
                per_device.iter().all(|&b| b < whole[0] * 6 / 10),
                "{per_device:?} of {whole:?}"
            ),
        }
    }
}

#[test]
fn examples_are_the_prompt_then_the_completion_and_eos() {
    let tokenizer = Arc::new(Tokenizer::from_file(fixtures().join("tokenizer/tiny/tokenizer.json")).unwrap());
    let mut columns = serde_json::Map::new();
    columns.insert("answer".to_string(), serde_json::json!(" 4."));
    let rows = vec![Example {
        index: 0,
        prompt: Prompt::Text("2 + 2 =".to_string()),
        columns,
        guide: None,
    }];
    let encoded = encode_examples(&tokenizer, &rows, "answer", 64).unwrap();
    let mut completion = tokenizer.encode(" 4.", false).unwrap();
    completion.extend(tokenizer.eos_id());
    assert_eq!(encoded[0].prompt, tokenizer.encode("2 + 2 =", true).unwrap());
    assert_eq!(encoded[0].completion, completion);
    assert!(encoded[0].loss_mask.iter().all(|&m| m));
    let cut = encode_examples(&tokenizer, &rows, "answer", encoded[0].prompt.len() + 1).unwrap();
    assert_eq!(cut[0].completion, completion[..1]);
    let error = encode_examples(&tokenizer, &rows, "completion", 64).unwrap_err();
    assert!(error.to_string().contains("no `completion` column"), "{error}");
}

/// A chat row: the prompt's turns, and `completion` as chat turns.
fn chat_row(prompt: serde_json::Value, completion: serde_json::Value) -> Example {
    let mut columns = serde_json::Map::new();
    columns.insert("completion".to_string(), completion);
    Example {
        index: 0,
        prompt: Prompt::Chat(serde_json::from_value(prompt).unwrap()),
        columns,
        guide: None,
    }
}

#[test]
fn multi_turn_completions_train_on_the_assistants_turns_only() {
    let tokenizer = Arc::new(Tokenizer::from_file(fixtures().join("tokenizer/tiny/tokenizer.json")).unwrap());
    let prompt = serde_json::json!([{"role": "user", "content": "What is 12*34?"}]);
    let completion = serde_json::json!([
        {"role": "assistant", "content": "<tool_call>12*34</tool_call>"},
        {"role": "tool", "content": "408"},
        {"role": "assistant", "content": "It is 408."},
    ]);
    let rows = vec![chat_row(prompt, completion)];
    let [example] = encode_examples(&tokenizer, &rows, "completion", 256)
        .unwrap()
        .try_into()
        .unwrap();
    // The template's text, turn after turn (the tiny template is ChatML).
    let turn = |role: &str, content: &str| format!("<|im_start|>{role}\n{content}<|im_end|>\n");
    let prompt_text = format!("{}<|im_start|>assistant\n", turn("user", "What is 12*34?"));
    assert_eq!(example.prompt, tokenizer.encode(&prompt_text, true).unwrap());
    let decode = |ids: &[u32]| tokenizer.decode(ids, false).unwrap();
    assert_eq!(
        decode(&example.completion),
        format!(
            "<tool_call>12*34</tool_call><|im_end|>\n{}<|im_start|>assistant\nIt is 408.<|im_end|>",
            turn("tool", "408")
        ),
        "the whole conversation, its last newline (after the last trained token) dropped"
    );
    // Trained: each assistant turn up to and including its EOS, nothing else.
    let mut trained: Vec<Vec<u32>> = vec![Vec::new()];
    for (&id, &mask) in example.completion.iter().zip(&example.loss_mask) {
        match mask {
            true => trained.last_mut().unwrap().push(id),
            false if !trained.last().unwrap().is_empty() => trained.push(Vec::new()),
            false => {}
        }
    }
    let trained: Vec<String> = trained.iter().map(|ids| decode(ids)).collect();
    assert_eq!(
        trained,
        ["<tool_call>12*34</tool_call><|im_end|>", "It is 408.<|im_end|>"]
    );

    // A completion must open with the assistant's turn, give each turn
    // its text, and hold nothing unknown.
    for (completion, needle) in [
        (
            serde_json::json!([{"role": "tool", "content": "1"}, {"role": "assistant", "content": "ok"}]),
            "must start with an assistant turn",
        ),
        (
            serde_json::json!([{"role": "assistant"}]),
            "turn 1 (assistant) has no text `content`",
        ),
        (
            serde_json::json!([{"role": "assistant", "content": "ok", "name": "bot"}]),
            "unknown field `name`",
        ),
    ] {
        let rows = vec![chat_row(
            serde_json::json!([{"role": "user", "content": "hi"}]),
            completion,
        )];
        let error = encode_examples(&tokenizer, &rows, "completion", 256).unwrap_err();
        assert!(error.to_string().contains(needle), "{error}");
    }
}

/// Tool calls in OpenAI's form (arguments as an object or a JSON string)
/// are rendered by a template that knows them, and trained on as the
/// assistant's text.
#[test]
fn tool_calls_in_completions_render_through_the_template() {
    let template = std::fs::read_to_string(fixtures().join("../../templates/chatml_tools.jinja")).unwrap();
    let tokenizer = Tokenizer::from_file(fixtures().join("tokenizer/tiny/tokenizer.json")).unwrap();
    let tokenizer = Arc::new(tokenizer.with_chat_template(template));
    let call = |arguments: serde_json::Value| {
        serde_json::json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "calculate", "arguments": arguments}}
        ]})
    };
    let trained_text =
        "<tool_call>\n{\"name\": \"calculate\", \"arguments\": {\"expression\": \"12*34\"}}\n</tool_call><|im_end|>";
    for arguments in [
        serde_json::json!({"expression": "12*34"}),
        serde_json::json!("{\"expression\": \"12*34\"}"),
    ] {
        let completion = serde_json::json!([
            call(arguments),
            {"role": "tool", "tool_call_id": "c1", "content": "408"},
            {"role": "assistant", "content": "408"},
        ]);
        let rows = vec![chat_row(
            serde_json::json!([{"role": "user", "content": "12*34?"}]),
            completion,
        )];
        let [example] = encode_examples(&tokenizer, &rows, "completion", 256)
            .unwrap()
            .try_into()
            .unwrap();
        let first: Vec<u32> = example
            .completion
            .iter()
            .zip(&example.loss_mask)
            .take_while(|(_, trained)| **trained)
            .map(|(&id, _)| id)
            .collect();
        assert_eq!(tokenizer.decode(&first, false).unwrap(), trained_text);
    }
    let bad = call(serde_json::json!("12*34"));
    let rows = vec![chat_row(
        serde_json::json!([{"role": "user", "content": "q"}]),
        serde_json::json!([bad]),
    )];
    let error = encode_examples(&tokenizer, &rows, "completion", 256).unwrap_err();
    assert!(error.to_string().contains("must be a JSON object"), "{error}");
}

/// A row's `tools` column (TRL's) is rendered as `grpo run` renders an
/// environment's tools: the SFT prompt is the episode's prompt, id for id;
/// a bad list is refused naming the row and the column.
#[test]
fn a_tools_column_renders_the_prompt_an_episode_starts_from() {
    let template = std::fs::read_to_string(fixtures().join("../../templates/chatml_tools.jinja")).unwrap();
    let tokenizer = Tokenizer::from_file(fixtures().join("tokenizer/tiny/tokenizer.json")).unwrap();
    let tokenizer = Arc::new(tokenizer.with_chat_template(template));
    let calculate = grpo_env::calculate::Calculate::new();
    let tool = calculate.spec().clone();
    let prompt = serde_json::json!([{"role": "user", "content": "12*34?"}]);
    let completion = serde_json::json!([{"role": "assistant", "content": "408"}]);
    let mut row = chat_row(prompt.clone(), completion);
    row.columns.insert("tools".into(), serde_json::json!([tool.to_json()]));
    let [example] = encode_examples(&tokenizer, std::slice::from_ref(&row), "completion", 512)
        .unwrap()
        .try_into()
        .unwrap();
    let encoder = PromptEncoder::new(tokenizer.clone()).unwrap();
    let episode = encoder.encode_episode(&row.prompt, &[tool]).unwrap();
    assert_eq!(example.prompt, episode.ids);
    assert!(episode.text.contains("\"name\": \"calculate\""), "{}", episode.text);

    row.columns
        .insert("tools".into(), serde_json::json!([{"type": "function"}]));
    let error = encode_examples(&tokenizer, &[row], "completion", 512).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("row 1: column `tools`: tools[0] has no `function` object"),
        "{error}"
    );
}

#[test]
fn the_config_has_defaults_and_refuses_unknown_keys() {
    let text = "[model]\nname = \"m\"\n[data]\npath = \"d.jsonl\"\n";
    let config = SftRunConfig::from_toml_str(text).unwrap();
    assert_eq!(config.data.completion_column, "completion");
    assert_eq!(config.trainer.batch_size, 8);
    assert_eq!(config.logging.out, Path::new("runs/sft"));
    let error = SftRunConfig::from_toml_str(&format!("{text}[trainer]\nbatch_sise = 4\n")).unwrap_err();
    assert!(error.to_string().contains("trainer.batch_sise"), "{error}");
    let text = with_overrides(text, &["trainer.max_steps=7".to_string()]).unwrap();
    assert_eq!(SftRunConfig::from_toml_str(&text).unwrap().trainer.max_steps, Some(7));
}
