"""Drives a running `grpo serve` that serves a LoRA adapter with the official `openai` Python client.

Usage: lora_client.py BASE_URL MODEL ADAPTER ADAPTER_PATH

Checks that `models.list` shows the adapter with the model as its parent
and its folder as root, that completions and chat completions under the
adapter's name answer under that name with other tokens than the base
model's, and that an unknown model is a NotFoundError. Run by
serving/tests/lora.rs with the interpreter of tools/test-venv.sh. Uses only
the stdlib and openai.
"""

import sys

import openai


def check(name, fn):
    fn()
    print(f"ok {name}", flush=True)


def main():
    base, model, adapter, path = sys.argv[1:5]
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)
    greedy = {"max_tokens": 8, "temperature": 0, "extra_body": {"ignore_eos": True}}

    def models():
        listed = {m.id: m for m in client.models.list().data}
        assert sorted(listed) == sorted([model, adapter]), listed
        card = listed[adapter].model_dump()
        assert card["parent"] == model and card["root"] == path, card
        assert listed[model].model_dump()["parent"] is None, listed[model]

    def completions():
        tuned = client.completions.create(model=adapter, prompt="hello world", **greedy)
        plain = client.completions.create(model=model, prompt="hello world", **greedy)
        assert tuned.model == adapter and plain.model == model, (tuned.model, plain.model)
        assert tuned.choices[0].text != plain.choices[0].text, (tuned.choices[0].text, plain.choices[0].text)

    def chat():
        r = client.chat.completions.create(model=adapter, messages=[{"role": "user", "content": "hi"}], **greedy)
        assert r.model == adapter, r
        assert r.choices[0].finish_reason == "length", r

    def unknown_model():
        try:
            client.completions.create(model="not-served", prompt="hi", max_tokens=1)
        except openai.NotFoundError as e:
            assert "not-served" in str(e), e
        else:
            raise AssertionError("an unknown model was served")

    for name, fn in [("models", models), ("completions", completions), ("chat", chat),
                     ("unknown_model", unknown_model)]:
        check(name, fn)
    print("all lora client checks passed")


if __name__ == "__main__":
    main()
