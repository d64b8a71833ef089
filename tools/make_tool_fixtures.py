#!/usr/bin/env python3
"""Writes the tool-calling chat-template fixture of grpo-model.

Run from the repository root:

    PY=$(tools/venv.sh)   # transformers 5.24.0
    "$PY" tools/make_tool_fixtures.py

The reference is transformers' `apply_chat_template(messages, tools=...,
chat_template=..., tokenize=False)` with the tiny test tokenizer, for two
templates that render tools: model/templates/chatml_tools.jinja (ChatML with
Hermes-style <tool_call> blocks) and the test template
model/tests/fixtures/tokenizer/llama3_tools.jinja (Llama 3 style JSON calls).
Conversations cover tools on offer or not, a system turn or not, assistant
turns with one or two calls and with or without text, consecutive tool
results, non-ASCII arguments and nested argument objects.

Writes model/tests/fixtures/tokenizer/tools_chat.json:
{"bos_token", "eos_token" (the tokenizer's), "templates": {name: source}, "tools": [OpenAI tool objects],
 "cases": [{"template", "messages", "tools" (bool), "add_generation_prompt", "text"}]}.
"""

import json
from pathlib import Path

from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "model" / "tests" / "fixtures" / "tokenizer"
TEMPLATES = {
    "chatml_tools": ROOT / "model" / "templates" / "chatml_tools.jinja",
    "llama3_tools": FIXTURES / "llama3_tools.jinja",
}

TOOLS = [
    {"type": "function", "function": {
        "name": "calculate",
        "description": "Evaluates an arithmetic expression exactly.",
        "parameters": {"type": "object", "properties": {
            "expression": {"type": "string", "description": "e.g. 12*(3+4)/5"}},
            "required": ["expression"]},
    }},
    {"type": "function", "function": {
        "name": "lookup",
        "description": "Finds a constant by name.",
        "parameters": {"type": "object", "properties": {
            "key": {"type": "string"}, "exact": {"type": "boolean", "default": True}},
            "required": ["key"]},
    }},
]


def call(name, arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


CONVERSATIONS = [
    [{"role": "user", "content": "What is 1234 * 5678?"}],
    [{"role": "system", "content": "You are exact."}, {"role": "user", "content": "What is 12*34?"}],
    [
        {"role": "user", "content": "What is 12*34?"},
        {"role": "assistant", "content": "", "tool_calls": [call("calculate", {"expression": "12*34"})]},
        {"role": "tool", "content": "408"},
        {"role": "assistant", "content": "12*34 = 408."},
    ],
    [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "π to 3 places, and 7/8?"},
        {"role": "assistant", "content": "Two calls.", "tool_calls": [
            call("lookup", {"key": "π", "exact": False}),
            call("calculate", {"expression": "7/8", "options": {"digits": 3, "mode": "exact"}}),
        ]},
        {"role": "tool", "content": "3.142"},
        {"role": "tool", "content": "7/8"},
        {"role": "user", "content": "Thanks."},
    ],
]


def main():
    tokenizer = AutoTokenizer.from_pretrained(FIXTURES / "tiny")
    templates = {name: path.read_text(encoding="utf-8") for name, path in TEMPLATES.items()}
    cases = []
    for name, source in templates.items():
        for messages in CONVERSATIONS:
            for with_tools in (True, False):
                for add_generation_prompt in (True, False):
                    text = tokenizer.apply_chat_template(
                        messages, tools=TOOLS if with_tools else None, chat_template=source,
                        add_generation_prompt=add_generation_prompt, tokenize=False)
                    cases.append({"template": name, "messages": messages, "tools": with_tools,
                                  "add_generation_prompt": add_generation_prompt, "text": text})
    out = FIXTURES / "tools_chat.json"
    tokens = {"bos_token": tokenizer.bos_token or "", "eos_token": tokenizer.eos_token or ""}
    out.write_text(json.dumps({**tokens, "templates": templates, "tools": TOOLS, "cases": cases},
                              ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out}: {len(cases)} cases")


if __name__ == "__main__":
    main()
