"""Structured outputs and forced tool calls of a running `grpo serve`, driven
by the official `openai` Python client and checked with `jsonschema`.

Usage: structured_client.py BASE_URL MODEL

The server serves a tiny random model, so whatever it would write on its own
is noise: every check below holds only because the answer is guided. Each
check covers at least 50 samples (10 requests of n = 5), raises on failure
(the script then exits non-zero) and prints one line when it passes. Run by
serving/tests/structured.rs with the interpreter of tools/test-venv.sh.
"""

import json
import re
import sys
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai

REQUESTS = 10
N = 5
MAX_TOKENS = 120

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 5},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "tags", "ok"],
    "additionalProperties": False,
}
CALCULATE = {"type": "function", "function": {"name": "calculate", "description": "Evaluates arithmetic.", "parameters": {
    "type": "object", "properties": {"expression": {"type": "string", "maxLength": 6}},
    "required": ["expression"], "additionalProperties": False}}}
FLIP = {"type": "function", "function": {"name": "flip", "description": "Flips a coin.", "parameters": {
    "type": "object", "properties": {"times": {"type": "integer", "minimum": 1, "maximum": 3}},
    "required": ["times"], "additionalProperties": False}}}
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in (CALCULATE, FLIP)}


def check(name, fn):
    fn()
    print(f"ok {name}", flush=True)


def main():
    base, model = sys.argv[1:3]
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": "Describe someone."}]
    schema_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}

    def chat(n_requests=REQUESTS, max_tokens=MAX_TOKENS, **kwargs):
        """Every choice of `n_requests` chat requests of n = N."""
        choices = []
        for seed in range(n_requests):
            r = client.chat.completions.create(model=model, messages=messages, n=N, seed=seed,
                                               max_tokens=max_tokens, **kwargs)
            assert len(r.choices) == N, r
            choices.extend(r.choices)
        assert n_requests < REQUESTS or len(choices) >= 50
        return choices

    def validated(text, schema):
        value = json.loads(text)
        jsonschema.validate(value, schema)
        return value

    def json_schema():
        ended = 0
        for c in chat(response_format=schema_format):
            if c.finish_reason == "stop":
                validated(c.message.content, SCHEMA)
                ended += 1
            else:
                assert c.finish_reason == "length", c
        assert ended >= 40, f"only {ended} answers ended on their own"

    def json_schema_cut():
        # Answers cut by max_tokens say so (and are not claimed to be whole).
        for c in chat(n_requests=2, response_format=schema_format, max_tokens=4):
            assert c.finish_reason == "length", c
            try:
                validated(c.message.content, SCHEMA)
            except (json.JSONDecodeError, jsonschema.ValidationError):
                pass
            else:
                raise AssertionError(f"4 tokens made a whole answer: {c.message.content!r}")

    def json_schema_streamed():
        ended = 0
        for seed in range(REQUESTS):
            stream = client.chat.completions.create(model=model, messages=messages, n=N, seed=seed,
                                                    max_tokens=MAX_TOKENS, response_format=schema_format, stream=True)
            texts, reasons = {}, {}
            for chunk in stream:
                for c in chunk.choices:
                    texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
                    if c.finish_reason:
                        reasons[c.index] = c.finish_reason
            assert sorted(reasons) == list(range(N)), reasons
            for i, reason in reasons.items():
                if reason == "stop":
                    validated(texts[i], SCHEMA)
                    ended += 1
                else:
                    assert reason == "length", reason
        assert ended >= 40, f"only {ended} streamed answers ended on their own"

    def json_object():
        for c in chat(response_format={"type": "json_object"}, max_tokens=60):
            if c.finish_reason == "stop":
                assert isinstance(json.loads(c.message.content), dict), c.message.content

    def regex_and_choice():
        pattern = r"[0-9]{2}-[a-z]{3}"
        for c in chat(extra_body={"structured_outputs": {"regex": pattern}}, max_tokens=30):
            assert c.finish_reason == "stop", c
            assert re.fullmatch(pattern, c.message.content), c.message.content
        choices = ["yes", "no", "not sure"]
        for c in chat(extra_body={"guided_choice": choices}, max_tokens=30):
            assert c.finish_reason == "stop", c
            assert c.message.content in choices, c.message.content
        r = client.completions.create(model=model, prompt="Say a number:", n=N, max_tokens=30,
                                      extra_body={"guided_regex": "[1-9][0-9]?"})
        for c in r.choices:
            assert re.fullmatch(r"[1-9][0-9]?", c.text), c.text

    def forced_calls(tool_choice, names):
        calls = 0
        for c in chat(tools=[CALCULATE, FLIP], tool_choice=tool_choice, parallel_tool_calls=False):
            assert c.finish_reason == "tool_calls", c
            assert len(c.message.tool_calls) == 1, c.message
            call = c.message.tool_calls[0]
            assert call.type == "function" and call.id, call
            assert call.function.name in names, call
            validated(call.function.arguments, PARAMETERS[call.function.name])
            calls += 1
        assert calls >= 50

    def required():
        forced_calls("required", {"calculate", "flip"})

    def required_parallel():
        # Several calls may follow one another; every call given is whole and
        # valid, and an answer that ends on its own ends with calls.
        calls = ended = 0
        for c in chat(tools=[CALCULATE, FLIP], tool_choice="required", max_tokens=200):
            if c.finish_reason == "tool_calls":
                ended += 1
                assert c.message.tool_calls, c.message
            else:
                assert c.finish_reason == "length", c
            for call in c.message.tool_calls or []:
                assert call.type == "function" and call.id, call
                validated(call.function.arguments, PARAMETERS[call.function.name])
                calls += 1
        assert calls >= 50 and ended >= 1, (calls, ended)

    def forced_calls_streamed():
        # OpenAI's tool-call deltas, put together by index as clients do.
        calls = 0
        for seed in range(REQUESTS):
            stream = client.chat.completions.create(model=model, messages=messages, n=N, seed=seed, max_tokens=MAX_TOKENS,
                                                    tools=[CALCULATE, FLIP], tool_choice="required",
                                                    parallel_tool_calls=False, stream=True)
            made, reasons = {}, {}
            for chunk in stream:
                for c in chunk.choices:
                    for delta in c.delta.tool_calls or []:
                        call = made.setdefault((c.index, delta.index), {"id": "", "name": "", "arguments": ""})
                        call["id"] += delta.id or ""
                        call["name"] += (delta.function and delta.function.name) or ""
                        call["arguments"] += (delta.function and delta.function.arguments) or ""
                    if c.finish_reason:
                        reasons[c.index] = c.finish_reason
            assert reasons == {i: "tool_calls" for i in range(N)}, reasons
            assert sorted(made) == [(i, 0) for i in range(N)], sorted(made)
            for call in made.values():
                assert call["id"] and call["name"] in PARAMETERS, call
                validated(call["arguments"], PARAMETERS[call["name"]])
                calls += 1
        assert calls >= 50

    def mixed_batch():
        # Unguided requests draw the same tokens beside guided ones as alone.
        def plain(seed):
            r = client.chat.completions.create(model=model, messages=messages, n=N, seed=seed, max_tokens=24)
            return [c.message.content for c in r.choices]

        def guided(seed):
            client.chat.completions.create(model=model, messages=messages, n=N, seed=seed, max_tokens=24,
                                           response_format=schema_format)

        with ThreadPoolExecutor(3) as pool:
            for seed in range(REQUESTS):
                alone = plain(seed)
                beside = [pool.submit(guided, 100 + seed), pool.submit(plain, seed), pool.submit(guided, 200 + seed)]
                assert beside[1].result() == alone, (seed, alone, beside[1].result())
                beside[0].result(), beside[2].result()

    def named():
        forced_calls({"type": "function", "function": {"name": "flip"}}, {"flip"})

    def refused():
        cases = [
            ("response_format", {"response_format": {"type": "json_schema",
                                                     "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}}),
            ("guided_regex", {"extra_body": {"guided_regex": "(a|b"}}),
            ("guided_json", {"response_format": {"type": "json_object"}, "extra_body": {"guided_json": SCHEMA}}),
            ("tool_choice", {"tools": [CALCULATE], "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
        ]
        for what, kwargs in cases:
            try:
                client.chat.completions.create(model=model, messages=messages, max_tokens=8, **kwargs)
            except openai.BadRequestError as e:
                assert e.status_code == 400, e
                assert e.param == what, (what, e.param, e)
            else:
                raise AssertionError(f"{what}: {kwargs} was accepted")

    for name, fn in [
        ("json_schema: 50 answers valid or cut", json_schema),
        ("json_schema: max_tokens cuts say length", json_schema_cut),
        ("json_schema streamed: 50 answers valid or cut", json_schema_streamed),
        ("json_object", json_object),
        ("regex and choice", regex_and_choice),
        ("tool_choice required: 50 valid calls", required),
        ("tool_choice named: 50 valid calls", named),
        ("tool_choice required, parallel calls: every call valid", required_parallel),
        ("tool_choice required streamed: 50 valid calls from deltas", forced_calls_streamed),
        ("unguided answers beside guided ones: 50 as alone", mixed_batch),
        ("invalid schema, regex, two guides, unknown tool: 400", refused),
    ]:
        check(name, fn)
    print("all structured output checks passed", flush=True)


if __name__ == "__main__":
    main()
