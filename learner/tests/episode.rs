//! Multi-turn episodes on the in-process engine, with a tiny random llama
//! and SmolLM2's tokenizer under a ChatML template: the model's sampled ids
//! are kept as sampled and carry loss, each environment answer is exactly
//! the template's text after the turn, the behaviour log-probs are the
//! policy's over the whole episode, later turns continue their slots, the
//! turn and token budgets end episodes, environment faults end theirs as
//! `on_error` says (each episode's end told once, under its own id), and on a
//! fleet of two engines every episode stays on the one that began it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use grpo_env::calculate::Calculate;
use grpo_env::environment::{Environment, EnvironmentError, EpisodeView, Reply, ToolEnvironment};
use grpo_env::guard::GuardedEnvironment;
use grpo_env::toolbox::Toolbox;
use grpo_learner::collect::PromptEncoder;
use grpo_learner::data::{ChatTurn, Example, Prompt};
use grpo_learner::episode::{Budget, EpisodeEnd, Episodes, run_episodes};
use grpo_learner::fleet::{Fleet, FleetConfig, LocalFleet, WorkerFleet};
use grpo_model::chat::ChatMessage;
use grpo_model::config::Family;
use grpo_model::decoder::Decoder;
use grpo_model::init::{Preset, preset_config, random_weights};
use grpo_model::load::upload_parameters;
use grpo_model::logprobs::LogprobsRunner;
use grpo_model::tokenizer::Tokenizer;
use grpo_model::tools::Tool;
use grpo_model::weights::{Safetensors, save_safetensors};
use grpo_reward::{BoxFuture, OnError};
use grpo_rollout::engine::{Engine, EngineConfig};
use grpo_rollout::guided::Guide;
use grpo_rollout::request::SamplingParams;
use grpo_xla::{Buffer, Client, ClientOptions, ElementType, Platform};

/// Answers "go on N" until the model has taken `turns` turns, then ends
/// with the number of turns as its reward.
struct GoOn {
    turns: usize,
}

impl Environment for GoOn {
    fn name(&self) -> &str {
        "go-on"
    }

    fn tools(&self) -> Vec<Tool> {
        Vec::new()
    }

    fn step<'a>(&'a self, episode: EpisodeView<'a>) -> BoxFuture<'a, Result<Reply, EnvironmentError>> {
        let taken = episode.messages.iter().filter(|m| m.role == "assistant").count();
        let reply = if taken >= self.turns {
            Reply::Done {
                reward: Some(taken as f32),
            }
        } else {
            Reply::Continue {
                messages: vec![ChatMessage::new("user", format!("go on {taken}"))],
                failed_calls: 0,
                guide: None,
            }
        };
        Box::pin(async move { Ok(reply) })
    }
}

/// The tiny random llama's client, weights and an in-process fleet.
struct Setup {
    client: Client,
    decoder: Decoder,
    params: Vec<Buffer>,
    encoder: PromptEncoder,
    tokenizer: Arc<Tokenizer>,
    runtime: tokio::runtime::Runtime,
}

fn setup() -> Setup {
    let client = Client::for_platform(
        Platform::Cpu,
        ClientOptions::default().compile_cache_dir(None).cpu_device_count(1),
    )
    .unwrap();
    let pretrained = grpo_model::pretrained::Pretrained::open(grpo_model::bundled::SMOLLM2_NAME).unwrap();
    let template = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../model/templates/chatml_tools.jinja"
    ))
    .unwrap();
    let tokenizer = pretrained
        .tokenizer
        .expect("run `grpo setup`")
        .with_chat_template(template);
    let config = preset_config(Family::Llama, Preset::Tiny, tokenizer.vocab_size(), Some(1), 2);
    let decoder = Decoder::new(config.clone());
    let dir = tempfile::tempdir().unwrap();
    save_safetensors(
        dir.path().join("model.safetensors"),
        &random_weights(&config, 5).unwrap(),
    )
    .unwrap();
    let weights = Safetensors::open_dir(dir.path()).unwrap();
    let params = upload_parameters(&client, client.device(0).unwrap(), &decoder, &weights, ElementType::F32).unwrap();
    let tokenizer = Arc::new(tokenizer);
    Setup {
        client,
        decoder,
        params,
        encoder: PromptEncoder::new(tokenizer.clone()).unwrap(),
        tokenizer,
        runtime: tokio::runtime::Runtime::new().unwrap(),
    }
}

impl Setup {
    fn fleet(&self) -> LocalFleet {
        self.fleet_continuing(true)
    }

    fn fleet_continuing(&self, continue_sequences: bool) -> LocalFleet {
        LocalFleet::new(self.engine(continue_sequences))
    }

    fn engine(&self, continue_sequences: bool) -> Engine {
        self.engine_with(8, continue_sequences)
    }

    fn engine_with(&self, slots: usize, continue_sequences: bool) -> Engine {
        let params = self
            .params
            .iter()
            .map(|b| b.copy_to_device(b.device()).unwrap())
            .collect();
        let config = EngineConfig {
            max_num_seqs: slots,
            max_model_len: 512,
            dtype: ElementType::F32,
            continue_sequences,
            // Off, so that the prompt tokens computed are continuation's count alone.
            share_prefixes: false,
            ..EngineConfig::default()
        };
        Engine::new(&self.client, self.decoder.clone(), params, config).unwrap()
    }

    fn run(&self, fleet: &mut dyn Fleet, environment: impl Environment + 'static, budget: Budget) -> Episodes {
        let guarded = GuardedEnvironment::new(Box::new(environment), Duration::from_secs(30), OnError::Fail);
        self.run_guarded(fleet, &guarded, 0, budget, usize::MAX)
    }

    fn run_guarded(
        &self,
        fleet: &mut dyn Fleet,
        environment: &GuardedEnvironment,
        first_id: u64,
        budget: Budget,
        concurrency: usize,
    ) -> Episodes {
        let rows = rows();
        let rows: Vec<&Example> = rows.iter().collect();
        let params = |i: usize| SamplingParams {
            n: 3,
            max_tokens: budget.max_turn_tokens,
            temperature: 1.0,
            seed: 40 + i as u32,
            ..SamplingParams::default()
        };
        run_episodes(
            fleet,
            environment,
            first_id,
            &self.runtime,
            &self.encoder,
            &rows,
            params,
            budget,
            concurrency,
        )
        .unwrap()
    }
}

fn rows() -> Vec<Example> {
    ["What is 12 times 34?", "Say hello."]
        .iter()
        .enumerate()
        .map(|(index, text)| Example {
            index,
            prompt: Prompt::Chat(vec![ChatTurn::new("user", text)]),
            columns: Default::default(),
            guide: None,
        })
        .collect()
}

#[test]
fn episodes_keep_sampled_ids_append_the_templates_answers_and_score_as_the_policy() {
    let s = setup();
    let mut fleet = s.fleet();
    let budget = Budget {
        max_turns: 5,
        max_turn_tokens: 6,
        max_episode_tokens: 300,
    };
    let Episodes { prompts, groups } = s.run(&mut fleet, GoOn { turns: 3 }, budget);
    assert_eq!(groups.len(), 2);
    let tokenizer = s.encoder.tokenizer();
    let eos = tokenizer.eos_id().unwrap();
    let mut sequences = Vec::new();
    for (prompt, group) in prompts.iter().zip(&groups) {
        assert_eq!(group.len(), 3);
        for episode in group {
            assert_eq!(
                (episode.end, episode.turns, episode.reward),
                (EpisodeEnd::Done, 3, Some(3.0))
            );
            let n = episode.tokens.len();
            assert_eq!(
                (episode.loss_mask.len(), episode.logprobs.len(), episode.versions.len()),
                (n, n, n)
            );
            // The spans between the model's turns are exactly what the
            // template writes after a turn: its closing, the answer, the
            // next assistant header.
            let mut spans: Vec<(bool, Vec<u32>)> = Vec::new();
            for (&token, &mine) in episode.tokens.iter().zip(&episode.loss_mask) {
                match spans.last_mut() {
                    Some((kind, ids)) if *kind == mine => ids.push(token),
                    _ => spans.push((mine, vec![token])),
                }
            }
            assert_eq!(spans.iter().filter(|(mine, _)| *mine).count(), 3, "three model turns");
            for (k, pair) in spans.windows(2).filter(|w| w[0].0).enumerate() {
                let (turn, answer) = (&pair[0].1, &pair[1].1);
                let closed = turn.last() == Some(&eos);
                let text = tokenizer.decode(answer, false).unwrap();
                let closing = if closed { "\n" } else { "<|im_end|>\n" };
                assert_eq!(
                    text,
                    format!(
                        "{closing}<|im_start|>user\ngo on {}<|im_end|>\n<|im_start|>assistant\n",
                        k + 1
                    )
                );
                assert!(
                    episode
                        .logprobs
                        .iter()
                        .zip(&episode.loss_mask)
                        .all(|(&lp, &m)| m || lp == 0.0)
                );
            }
            sequences.push([prompt.ids.clone(), episode.tokens.clone()].concat());
        }
    }
    // Later turns continued their episodes' slots.
    assert!(fleet.stats().kept_prompt_tokens > 0, "{:?}", fleet.stats());
    // Each sampled token's behaviour log-prob is the policy's given the
    // whole episode before it, as the learner will score it.
    let runner = LogprobsRunner::new(&s.client, s.decoder.clone(), ElementType::F32);
    let scored = runner.run(&s.params, &sequences).unwrap();
    let episodes = groups.iter().flatten();
    for ((episode, stats), prompt) in episodes.zip(&scored).zip(prompts.iter().flat_map(|p| [&p.ids; 3])) {
        for (j, (&mine, &lp)) in episode.loss_mask.iter().zip(&episode.logprobs).enumerate() {
            if mine {
                let want = stats.logprobs[prompt.len() - 1 + j];
                assert!((lp - want).abs() < 1e-4, "token {j}: engine {lp}, policy {want}");
            }
        }
    }
}

#[test]
fn budgets_end_episodes_and_a_turn_without_calls_ends_a_tool_episode() {
    let s = setup();
    let mut fleet = s.fleet();
    let turns = Budget {
        max_turns: 2,
        max_turn_tokens: 5,
        max_episode_tokens: 300,
    };
    for episode in s.run(&mut fleet, GoOn { turns: 9 }, turns).groups.iter().flatten() {
        assert_eq!(
            (episode.end, episode.turns, episode.reward),
            (EpisodeEnd::MaxTurns, 2, None)
        );
        assert!(episode.tokens.len() <= 5 + 30 + 5);
    }
    let tokens = Budget {
        max_turns: 9,
        max_turn_tokens: 5,
        max_episode_tokens: 30,
    };
    for episode in s.run(&mut fleet, GoOn { turns: 9 }, tokens).groups.iter().flatten() {
        assert_eq!(episode.end, EpisodeEnd::TokenBudget);
        assert!(episode.tokens.len() <= 30, "{}", episode.tokens.len());
    }
    let tools = ToolEnvironment::new(Toolbox::new().with(Calculate::new()).unwrap());
    for episode in s.run(&mut fleet, tools, turns).groups.iter().flatten() {
        // A random model calls no tool: its first turn is its answer.
        assert_eq!(
            (episode.end, episode.turns, episode.tool_calls),
            (EpisodeEnd::Done, 1, 0)
        );
    }
}

#[test]
fn continuing_slots_prefills_only_what_each_turn_adds() {
    let s = setup();
    let budget = Budget {
        max_turns: 4,
        max_turn_tokens: 8,
        max_episode_tokens: 300,
    };
    let mut computed = Vec::new();
    let mut runs = Vec::new();
    for continuing in [true, false] {
        let mut fleet = s.fleet_continuing(continuing);
        runs.push(s.run(&mut fleet, GoOn { turns: 4 }, budget));
        let stats = fleet.stats();
        computed.push(stats.prompt_tokens - stats.shared_prompt_tokens - stats.kept_prompt_tokens);
    }
    // The same episodes either way: the same tokens, log-probs within 1e-5.
    assert!(
        runs[0]
            .prompts
            .iter()
            .zip(&runs[1].prompts)
            .all(|(a, b)| a.ids == b.ids)
    );
    for (a, b) in runs[0].groups.iter().flatten().zip(runs[1].groups.iter().flatten()) {
        assert!(a.tokens == b.tokens && a.loss_mask == b.loss_mask && a.messages == b.messages);
        assert!(a.logprobs.iter().zip(&b.logprobs).all(|(x, y)| (x - y).abs() < 1e-5));
    }
    let episodes = runs[0].groups.iter().flatten().count() as u64;
    // Without continuation every turn prefills its whole history; with it,
    // a turn computes its answer's tokens and the turn's last token.
    assert_eq!(computed[0], computed_when_continued(&runs[0]), "with continuation");
    eprintln!(
        "prompt tokens computed per episode: {:.1} continuing, {:.1} prefilling whole",
        computed[0] as f64 / episodes as f64,
        computed[1] as f64 / episodes as f64
    );
    assert!(computed[1] > 2 * computed[0], "{computed:?}");
}

/// The tokens `episodes` computed as prompts when every later turn
/// continued its slot: the prompts, each answer's tokens, and each later
/// turn's last token.
fn computed_when_continued(episodes: &Episodes) -> u64 {
    let prompts: u64 = episodes.prompts.iter().map(|p| p.ids.len() as u64).sum();
    let answers: u64 = episodes
        .groups
        .iter()
        .flatten()
        .map(|e| e.loss_mask.iter().filter(|m| !**m).count() as u64 + (e.turns as u64 - 1))
        .sum();
    prompts + answers
}

#[test]
fn rows_beyond_the_slots_wait_so_that_live_episodes_keep_theirs() {
    let s = setup();
    let budget = Budget {
        max_turns: 4,
        max_turn_tokens: 8,
        max_episode_tokens: 300,
    };
    let (mut runs, mut stats) = (Vec::new(), Vec::new());
    for concurrency in [usize::MAX, 3] {
        let mut fleet = LocalFleet::new(s.engine_with(4, true));
        let environment = GuardedEnvironment::new(Box::new(GoOn { turns: 4 }), Duration::from_secs(30), OnError::Fail);
        runs.push(s.run_guarded(&mut fleet, &environment, 0, budget, concurrency));
        stats.push(fleet.stats());
    }
    // All at once, the two rows' six episodes take turns in four slots and
    // evict one another's; a row at a time, every later turn continues
    // (only ended episodes are evicted).
    let computed: Vec<u64> = stats
        .iter()
        .map(|e| e.prompt_tokens - e.shared_prompt_tokens - e.kept_prompt_tokens)
        .collect();
    assert!(computed[0] > computed_when_continued(&runs[0]), "{stats:?}");
    assert_eq!(computed[1], computed_when_continued(&runs[1]), "{stats:?}");
    // The same episodes either way.
    assert_eq!(runs[0].prompts, runs[1].prompts);
    for (a, b) in runs[0].groups.iter().flatten().zip(runs[1].groups.iter().flatten()) {
        assert!(a.tokens == b.tokens && a.messages == b.messages);
        assert!(a.logprobs.iter().zip(&b.logprobs).all(|(x, y)| (x - y).abs() < 1e-5));
    }
}

#[test]
fn on_a_fleet_of_two_engines_each_episode_stays_where_it_began() {
    let s = setup();
    let mut fleet = WorkerFleet::new(FleetConfig::default(), s.decoder.config().vocab_size).unwrap();
    let handles = [
        fleet.add_engine("first".into(), s.engine(true)),
        fleet.add_engine("second".into(), s.engine(true)),
    ];
    fleet.start_at(0, &|| Ok(Vec::new())).unwrap();
    let budget = Budget {
        max_turns: 4,
        max_turn_tokens: 8,
        max_episode_tokens: 300,
    };
    let episodes = s.run(&mut fleet, GoOn { turns: 4 }, budget);
    let stats: Vec<_> = handles
        .iter()
        .map(|h| s.runtime.block_on(h.stats()).unwrap().engine)
        .collect();
    // Both engines took a row's episodes, and every later turn continued
    // its slot on the engine that served the turn before.
    assert!(stats.iter().all(|e| e.prompt_tokens > 0), "{stats:?}");
    let computed: u64 = stats
        .iter()
        .map(|e| e.prompt_tokens - e.shared_prompt_tokens - e.kept_prompt_tokens)
        .sum();
    assert_eq!(computed, computed_when_continued(&episodes), "{stats:?}");
}

/// Fails every turn of odd-numbered episodes at their second turn (else
/// goes on), and records the ids it sees and the ends it is told.
#[derive(Default)]
struct Flaky {
    seen: Arc<Mutex<Vec<u64>>>,
    ended: Arc<Mutex<Vec<u64>>>,
}

impl Environment for Flaky {
    fn name(&self) -> &str {
        "flaky"
    }

    fn tools(&self) -> Vec<Tool> {
        Vec::new()
    }

    fn step<'a>(&'a self, episode: EpisodeView<'a>) -> BoxFuture<'a, Result<Reply, EnvironmentError>> {
        self.seen.lock().unwrap().push(episode.id);
        let taken = episode.messages.iter().filter(|m| m.role == "assistant").count();
        let reply = if episode.id % 2 == 1 && taken == 2 {
            Err(EnvironmentError("the tool server went away".into()))
        } else {
            Ok(Reply::Continue {
                messages: vec![ChatMessage::new("user", "go on")],
                failed_calls: 0,
                guide: None,
            })
        };
        Box::pin(async move { reply })
    }

    fn end(&self, id: u64) -> BoxFuture<'_, ()> {
        self.ended.lock().unwrap().push(id);
        Box::pin(async {})
    }
}

#[test]
fn faults_end_episodes_as_on_error_says_and_every_end_is_told_once() {
    let s = setup();
    let mut fleet = s.fleet();
    let budget = Budget {
        max_turns: 3,
        max_turn_tokens: 4,
        max_episode_tokens: 300,
    };
    for (on_error, first_id) in [(OnError::Score(-1.0), 100), (OnError::Skip, 200)] {
        let flaky = Flaky::default();
        let (seen, ended) = (flaky.seen.clone(), flaky.ended.clone());
        let guarded = GuardedEnvironment::new(Box::new(flaky), Duration::from_secs(30), on_error);
        let episodes = s.run_guarded(&mut fleet, &guarded, first_id, budget, usize::MAX);
        let flat: Vec<_> = episodes.groups.iter().flatten().collect();
        assert_eq!(flat.len(), 6);
        for (k, episode) in flat.iter().enumerate() {
            let id = first_id + k as u64;
            if id % 2 == 1 {
                let want = match on_error {
                    OnError::Score(score) => (Some(score), false),
                    _ => (None, true),
                };
                assert_eq!((episode.end, episode.turns), (EpisodeEnd::Fault, 2), "episode {id}");
                assert_eq!((episode.reward, episode.skipped), want, "episode {id}");
            } else {
                assert_eq!((episode.end, episode.turns), (EpisodeEnd::MaxTurns, 3), "episode {id}");
                assert_eq!((episode.reward, episode.skipped), (None, false));
            }
        }
        assert_eq!(guarded.metrics().faults, 3);
        // Ids are the episode's own through its turns (a faulted episode
        // asked twice, the others three times); each end is told once.
        let seen = seen.lock().unwrap().clone();
        for id in first_id..first_id + 6 {
            let asked = seen.iter().filter(|&&s| s == id).count();
            assert_eq!(asked, if id % 2 == 1 { 2 } else { 3 }, "episode {id}");
        }
        let mut ended = ended.lock().unwrap().clone();
        ended.sort();
        assert_eq!(ended, (first_id..first_id + 6).collect::<Vec<_>>());
    }
    let failing = GuardedEnvironment::new(Box::new(Flaky::default()), Duration::from_secs(30), OnError::Fail);
    let rows = rows();
    let rows: Vec<&Example> = rows.iter().collect();
    let params = |_| SamplingParams {
        n: 3,
        max_tokens: 4,
        ..SamplingParams::default()
    };
    let error = run_episodes(
        &mut fleet,
        &failing,
        0,
        &s.runtime,
        &s.encoder,
        &rows,
        params,
        budget,
        usize::MAX,
    )
    .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("environment flaky failed on episode 1: the tool server went away"),
        "{error}"
    );
}

/// A turn whose only call is malformed keeps the call's text as the
/// assistant message's content, so the template renders the turn as an
/// extension of the prompt it was sampled after (an empty assistant
/// message renders `<|im_start|>assistant<|im_end|>`, which is not, and
/// stopped a run when the model first wrote such a turn).
#[test]
fn a_turn_of_only_a_malformed_call_renders_after_its_prompt() {
    let encoder = setup().encoder;
    let tools = [Tool::from_json(&serde_json::json!({"type": "function", "function": {
        "name": "calculate", "description": "d", "parameters": {"type": "object"}
    }}))
    .unwrap()];
    let prompt = vec![
        ChatMessage::new("system", "Solve it.".to_string()),
        ChatMessage::new("user", "What is 12*34?".to_string()),
    ];
    let sampled_after = encoder.render_tools(&prompt, true, &tools).unwrap();
    for text in [
        "<tool_call>{\"name\": \"calculate\", \"arguments\": {\"expression\": 12*34}}</tool_call>",
        "<tool_call>{\"name\": \"calculate\"",
        "Let me see. <tool_call>[1]</tool_call>",
    ] {
        let turn = grpo_model::tools::parse_tool_calls(text, encoder.tool_format());
        assert_eq!(turn.malformed().len(), 1, "{text}");
        let message = ChatMessage::new("assistant", turn.content.clone())
            .with_tool_calls(turn.well_formed().into_iter().cloned().collect());
        let mut messages = prompt.clone();
        messages.push(message);
        let with_turn = encoder.render_tools(&messages, false, &tools).unwrap();
        let added = with_turn
            .strip_prefix(sampled_after.as_str())
            .unwrap_or_else(|| panic!("{text}: the turn renders as {with_turn:?}, not after {sampled_after:?}"));
        assert!(added.contains(text), "{text}: the turn's text is kept: {added:?}");
    }
}

/// Asks rows with an `ask` column a yes-or-no question after the first
/// turn, guiding the answer to one of the two; others only "go on". Ends
/// after the second turn.
struct AskOnce;

impl Environment for AskOnce {
    fn name(&self) -> &str {
        "ask-once"
    }

    fn tools(&self) -> Vec<Tool> {
        Vec::new()
    }

    fn step<'a>(&'a self, episode: EpisodeView<'a>) -> BoxFuture<'a, Result<Reply, EnvironmentError>> {
        let taken = episode.messages.iter().filter(|m| m.role == "assistant").count();
        let ask = episode.row.contains_key("ask");
        let reply = match taken {
            1 if ask => Reply::Continue {
                messages: vec![ChatMessage::new("user", "Yes or no?")],
                failed_calls: 0,
                guide: Some(Guide::Choice(vec!["yes".into(), "no".into()])),
            },
            1 => Reply::Continue {
                messages: vec![ChatMessage::new("user", "go on")],
                failed_calls: 0,
                guide: None,
            },
            _ => Reply::Done { reward: None },
        };
        Box::pin(async move { Ok(reply) })
    }
}

#[test]
fn each_turn_keeps_its_rows_guide_unless_the_environment_gives_the_next_one() {
    let s = setup();
    let engine = s.engine(true).with_tokenizer(s.tokenizer.clone());
    let mut fleet = LocalFleet::new(engine);
    let mut rows = rows();
    // Row 0: free, then the environment's yes-or-no. Row 1: its own guide on every turn.
    rows[0].columns.insert("ask".into(), true.into());
    let letters = "[a-z]{1,6}";
    rows[1].guide = Some(Guide::Regex(letters.into()));
    let refs: Vec<&Example> = rows.iter().collect();
    let budget = Budget {
        max_turns: 2,
        max_turn_tokens: 12,
        max_episode_tokens: 300,
    };
    let params = |i: usize| SamplingParams {
        n: 4,
        max_tokens: budget.max_turn_tokens,
        temperature: 1.0,
        seed: 7 + i as u32,
        guide: rows[i].guide.clone(),
        ..SamplingParams::default()
    };
    let guarded = GuardedEnvironment::new(Box::new(AskOnce), Duration::from_secs(30), OnError::Fail);
    let episodes = run_episodes(
        &mut fleet,
        &guarded,
        0,
        &s.runtime,
        &s.encoder,
        &refs,
        params,
        budget,
        usize::MAX,
    )
    .unwrap();
    let turns = |episode: &grpo_learner::episode::Episode| -> Vec<String> {
        let said = episode.messages.iter().filter(|m| m.role == "assistant");
        said.map(|m| m.content.clone()).collect()
    };
    let is_letters = |text: &str| (1..=6).contains(&text.len()) && text.chars().all(|c| c.is_ascii_lowercase());
    for episode in &episodes.groups[0] {
        let said = turns(episode);
        assert_eq!(said.len(), 2, "{said:?}");
        assert!(
            ["yes", "no"].contains(&said[1].as_str()),
            "the environment's guide: {said:?}"
        );
    }
    for episode in &episodes.groups[1] {
        let said = turns(episode);
        assert_eq!(said.len(), 2, "{said:?}");
        assert!(
            said.iter().all(|text| is_letters(text)),
            "the row's guide on every turn: {said:?}"
        );
    }
}
