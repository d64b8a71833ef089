"""Drives a running `grpo serve` with the official `openai` Python client.

Usage: openai_client.py BASE_URL API_KEY MODEL

BASE_URL is the server's root (http://127.0.0.1:PORT); the client talks to
BASE_URL/v1. Each check raises on failure, so the script exits non-zero; it
prints one line per passed check. Run by serving/tests/openai_client.rs with
the interpreter of tools/test-venv.sh. Uses only the stdlib and openai.
"""

import sys

import openai

MAX_TOKENS = 4
TOOL = {"type": "function", "function": {"name": "calculate", "description": "Evaluates arithmetic.",
                                         "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}


def check(name, fn):
    fn()
    print(f"ok {name}", flush=True)


def main():
    base, key, model = sys.argv[1:4]
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=60)
    prompt = "hello world"
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    ignore_eos = {"ignore_eos": True}

    def models():
        listed = client.models.list()
        ids = [m.id for m in listed.data]
        assert ids == [model], ids
        assert listed.data[0].object == "model"

    def completion():
        r = client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                      extra_body=ignore_eos)
        assert r.object == "text_completion", r
        assert r.model == model, r
        assert len(r.choices) == 1, r
        assert r.choices[0].finish_reason == "length", r
        assert isinstance(r.choices[0].text, str), r
        assert r.usage.completion_tokens == MAX_TOKENS, r.usage
        assert r.usage.total_tokens == r.usage.prompt_tokens + MAX_TOKENS, r.usage

    def completion_n_logprobs():
        r = client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS, n=2, temperature=0.8,
                                      seed=1, logprobs=2, extra_body=ignore_eos)
        assert sorted(c.index for c in r.choices) == [0, 1], r
        for c in r.choices:
            lp = c.logprobs
            assert len(lp.tokens) == MAX_TOKENS, lp
            assert len(lp.token_logprobs) == MAX_TOKENS, lp
            assert all(x <= 0.0 for x in lp.token_logprobs), lp
            assert len(lp.top_logprobs) == MAX_TOKENS, lp
            assert all(1 <= len(top) <= 3 for top in lp.top_logprobs), lp
            assert "".join(lp.tokens) == c.text, (lp.tokens, c.text)
        assert r.usage.completion_tokens == 2 * MAX_TOKENS, r.usage

    def completion_seed():
        texts = [
            [c.text for c in client.completions.create(model=model, prompt=prompt, max_tokens=8, n=2,
                                                       temperature=1.0, seed=1234, extra_body=ignore_eos).choices]
            for _ in range(2)
        ]
        assert texts[0] == texts[1], texts

    def completion_stream():
        stream = client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS, n=2, temperature=0.8,
                                           seed=3, logprobs=1, stream=True,
                                           stream_options={"include_usage": True}, extra_body=ignore_eos)
        chunks = list(stream)
        usage = chunks[-1]
        assert usage.choices == [], usage
        assert usage.usage.completion_tokens == 2 * MAX_TOKENS, usage
        prompt_tokens = usage.usage.prompt_tokens
        assert prompt_tokens > 0 and usage.usage.total_tokens == prompt_tokens + 2 * MAX_TOKENS, usage
        texts, finish = {0: "", 1: ""}, {}
        for chunk in chunks[:-1]:
            assert chunk.usage is None, chunk
            for c in chunk.choices:
                texts[c.index] += c.text
                if c.finish_reason is not None:
                    finish[c.index] = c.finish_reason
        assert finish == {0: "length", 1: "length"}, finish
        whole = client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS, n=2, temperature=0.8,
                                          seed=3, extra_body=ignore_eos)
        assert texts == {c.index: c.text for c in whole.choices}, (texts, whole)
        assert whole.usage.prompt_tokens == prompt_tokens, whole.usage

    def chat():
        r = client.chat.completions.create(model=model, messages=messages, max_tokens=MAX_TOKENS, temperature=0,
                                           extra_body=ignore_eos)
        assert r.object == "chat.completion", r
        m = r.choices[0].message
        assert m.role == "assistant" and isinstance(m.content, str), m
        assert r.choices[0].finish_reason == "length", r
        assert r.usage.completion_tokens == MAX_TOKENS, r.usage

    def chat_n_logprobs():
        r = client.chat.completions.create(model=model, messages=messages, max_completion_tokens=MAX_TOKENS, n=2,
                                           temperature=0.8, seed=5, logprobs=True, top_logprobs=2,
                                           extra_body=ignore_eos)
        assert sorted(c.index for c in r.choices) == [0, 1], r
        for c in r.choices:
            content = c.logprobs.content
            assert len(content) == MAX_TOKENS, content
            for entry in content:
                assert entry.logprob <= 0.0, entry
                assert isinstance(entry.bytes, list), entry
                assert len(entry.top_logprobs) == 2, entry
            assert "".join(e.token for e in content) == c.message.content, (content, c.message)
        assert r.usage.completion_tokens == 2 * MAX_TOKENS, r.usage

    def chat_seed():
        texts = [
            [c.message.content for c in client.chat.completions.create(
                model=model, messages=messages, max_tokens=8, n=2, temperature=1.0, seed=99,
                extra_body=ignore_eos).choices]
            for _ in range(2)
        ]
        assert texts[0] == texts[1], texts

    def chat_stream():
        stream = client.chat.completions.create(model=model, messages=messages, max_tokens=MAX_TOKENS, n=2,
                                                temperature=0.8, seed=7, logprobs=True, top_logprobs=1, stream=True,
                                                stream_options={"include_usage": True}, extra_body=ignore_eos)
        chunks = list(stream)
        usage = chunks[-1]
        assert usage.choices == [], usage
        assert usage.usage.completion_tokens == 2 * MAX_TOKENS, usage
        texts, roles, finish, logprobs = {0: "", 1: ""}, {}, {}, {0: 0, 1: 0}
        for chunk in chunks[:-1]:
            assert chunk.object == "chat.completion.chunk", chunk
            assert chunk.usage is None, chunk
            for c in chunk.choices:
                if c.delta.role is not None:
                    roles[c.index] = c.delta.role
                texts[c.index] += c.delta.content or ""
                if c.logprobs is not None and c.logprobs.content:
                    logprobs[c.index] += len(c.logprobs.content)
                if c.finish_reason is not None:
                    finish[c.index] = c.finish_reason
        assert roles == {0: "assistant", 1: "assistant"}, roles
        assert finish == {0: "length", 1: "length"}, finish
        assert logprobs == {0: MAX_TOKENS, 1: MAX_TOKENS}, logprobs
        whole = client.chat.completions.create(model=model, messages=messages, max_tokens=MAX_TOKENS, n=2,
                                               temperature=0.8, seed=7, extra_body=ignore_eos)
        assert texts == {c.index: c.message.content for c in whole.choices}, (texts, whole)
        assert whole.usage.prompt_tokens == usage.usage.prompt_tokens, (whole.usage, usage.usage)

    def wrong_key():
        bad = openai.OpenAI(base_url=f"{base}/v1", api_key=key + "-wrong", max_retries=0, timeout=60)
        try:
            bad.models.list()
        except openai.AuthenticationError as e:
            assert e.status_code == 401, e
        else:
            raise AssertionError("a wrong key was accepted")

    def bad_request():
        try:
            client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=-1)
        except openai.BadRequestError as e:
            assert e.status_code == 400, e
            assert "temperature" in str(e), e
        else:
            raise AssertionError("temperature -1 was accepted")

    def unsupported_fields():
        # Fields that would change the answer and that grpo does not implement are refused, naming the field.
        asks = [
            ("best_of", lambda: client.completions.create(
                model=model, prompt=prompt, max_tokens=MAX_TOKENS, best_of=3)),
            ("logit_bias", lambda: client.completions.create(
                model=model, prompt=prompt, max_tokens=MAX_TOKENS, logit_bias={"17": 100})),
            # This server's template ignores tools: refused, saying how to serve one that renders them.
            ("--chat-template", lambda: client.chat.completions.create(
                model=model, messages=messages, max_tokens=MAX_TOKENS, tools=[TOOL])),
        ]
        for field, ask in asks:
            try:
                ask()
            except openai.BadRequestError as e:
                assert e.status_code == 400, e
                assert field in str(e), (field, e)
            else:
                raise AssertionError(f"{field} was accepted")

    for name, fn in [
        ("models.list", models),
        ("completions", completion),
        ("completions n=2 logprobs=2", completion_n_logprobs),
        ("completions seed reproducibility", completion_seed),
        ("completions stream include_usage", completion_stream),
        ("chat", chat),
        ("chat n=2 logprobs top_logprobs", chat_n_logprobs),
        ("chat seed reproducibility", chat_seed),
        ("chat stream include_usage logprobs", chat_stream),
        ("AuthenticationError for a wrong key", wrong_key),
        ("BadRequestError for temperature -1", bad_request),
        ("BadRequestError for fields grpo does not implement", unsupported_fields),
    ]:
        check(name, fn)
    print("all openai client checks passed", flush=True)


if __name__ == "__main__":
    main()
