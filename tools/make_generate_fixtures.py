#!/usr/bin/env python3
"""Reference greedy generations by Hugging Face transformers'
`model.generate(..., do_sample=False)` (f32, attn_implementation="eager", CPU)
for the tiny parity models and for SmolLM2-135M-Instruct, so grpo's sampler at
temperature 0 (KV cache, positions, stopping) can be checked token for token.

Regenerate (from the repository root; tools/venv.sh creates or extends the
venv with torch, transformers and safetensors and prints its python; the
SmolLM2 part needs the converted HF folder
<grpo cache>/models/smollm2-135m-instruct, <grpo cache> being
${GRPO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/grpo}):

    "$(tools/venv.sh)" tools/make_generate_fixtures.py

Writes model/tests/fixtures/generate/expected.json:

    {"generator", "transformers", "torch", "min_margin_threshold",
     "tiny":    {"max_new_tokens": 16, "eos_token_id": null, "pad_token_id": 0,
                 "cases": [{"family", "prompt_ids", "generated_ids",
                            "margins", "min_margin"}]},
     "smollm2": {"model", "max_new_tokens": 32, "eos_token_id": 2,
                 "pad_token_id": 2,
                 "cases": [{"question", "prompt_text", "prompt_ids",
                            "generated_ids", "generated_text",
                            "stopped_at_eos", "margins", "min_margin"}]},
     "dropped": [{"model", "prompt_ids", "min_margin", "step", "reason"}]}

generated_ids are the new tokens only (not the prompt); for SmolLM2 they end
with eos (2) when generation stopped on it (stopped_at_eos). margins[t] is
top1 - top2 of the raw logits (`output_logits`) at generation step t, i.e. how
far the greedy choice is from a tie; a case is kept only when its smallest
margin is >= min_margin_threshold (a greedy comparison below that would be
comparing float noise), the others are listed in "dropped". Margins are
rounded to 1e-4 so that reruns rewrite the same bytes.
"""

import json
import os
import sys
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

ROOT = Path(__file__).resolve().parent.parent
PARITY = ROOT / "model" / "tests" / "fixtures" / "parity"
OUT = ROOT / "model" / "tests" / "fixtures" / "generate" / "expected.json"
CACHE = Path(
    os.environ.get("GRPO_CACHE_DIR")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "grpo"
)
SMOLLM2 = CACHE / "models" / "smollm2-135m-instruct"

MIN_MARGIN = 1e-3
MAX_BYTES = 50 * 1024
MARGIN_DECIMALS = 4

FAMILIES = ["llama", "qwen2", "qwen3"]
TINY_NEW_TOKENS = 16
TINY_PAD = 0
# Lengths 1, 5 and 9; ids in [1, 128).
TINY_PROMPTS = [
    [17],
    [5, 99, 42, 7, 120],
    [3, 64, 31, 88, 12, 101, 56, 9, 77],
]

SMOLLM2_NEW_TOKENS = 32
SMOLLM2_EOS = 2
QUESTIONS = [
    "What is 7 + 5?",
    "Name three colors.",
    "Write a haiku about the sea.",
    "Translate 'good morning' to French.",
    "What is the capital of Japan?",
]


def check(cond, msg):
    if not cond:
        sys.exit(f"make_generate_fixtures.py: FAILED: {msg}")


def greedy(model, prompt_ids, max_new_tokens, eos_token_id, pad_token_id):
    """(generated ids, per-step top1 - top2 margins of the raw logits)."""
    gen_cfg = GenerationConfig(
        do_sample=False,
        num_beams=1,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        bos_token_id=None,
        output_scores=True,
        output_logits=True,
        return_dict_in_generate=True,
    )
    input_ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            generation_config=gen_cfg,
        )
    seq = out.sequences[0].tolist()
    check(seq[: len(prompt_ids)] == prompt_ids, "generate did not echo the prompt")
    generated = seq[len(prompt_ids):]
    check(len(out.logits) == len(generated), f"{len(out.logits)} logits for {len(generated)} tokens")
    margins = []
    for step, (logits, scores) in enumerate(zip(out.logits, out.scores)):
        logits = logits[0].float()
        top = torch.topk(logits, 2)
        check(int(top.indices[0]) == generated[step], f"step {step}: argmax {int(top.indices[0])} != {generated[step]}")
        check(int(scores[0].argmax()) == generated[step], f"step {step}: processed scores disagree")
        margins.append((top.values[0] - top.values[1]).item())
    if eos_token_id is None:
        check(len(generated) == max_new_tokens, "stopped early without eos")
    else:
        check(len(generated) == max_new_tokens or generated[-1] == eos_token_id, "stopped early, not on eos")
        check(eos_token_id not in generated[:-1], "eos before the last token")
    return generated, margins


def summarize(margins):
    step = min(range(len(margins)), key=lambda i: margins[i])
    return margins[step], step


def rounded(margins):
    return [round(m, MARGIN_DECIMALS) for m in margins]


def main():
    torch.set_num_threads(1)  # one reduction order: reruns give the same bits
    torch.manual_seed(0)  # unused by greedy decoding; for safety
    dropped = []
    report = []

    tiny_cases = []
    for family in FAMILIES:
        model = AutoModelForCausalLM.from_pretrained(
            PARITY / family, dtype=torch.float32, attn_implementation="eager"
        ).eval()
        check(model.config.vocab_size == 128, f"{family} vocab")
        for prompt in TINY_PROMPTS:
            check(all(1 <= t < 128 for t in prompt), "tiny prompt ids out of range")
            generated, margins = greedy(model, prompt, TINY_NEW_TOKENS, None, TINY_PAD)
            m, step = summarize(margins)
            report.append((family, len(prompt), m, step))
            if m < MIN_MARGIN:
                dropped.append({"model": family, "prompt_ids": prompt, "min_margin": m, "step": step,
                                "reason": f"min top-2 logit margin {m:.3e} < {MIN_MARGIN}"})
                continue
            tiny_cases.append({"family": family, "prompt_ids": prompt, "generated_ids": generated,
                               "margins": rounded(margins), "min_margin": round(m, MARGIN_DECIMALS)})

    check((SMOLLM2 / "model.safetensors").exists(), f"no converted SmolLM2 folder at {SMOLLM2}")
    tokenizer = AutoTokenizer.from_pretrained(SMOLLM2)
    model = AutoModelForCausalLM.from_pretrained(
        SMOLLM2, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    check(model.config.eos_token_id == SMOLLM2_EOS, f"SmolLM2 eos {model.config.eos_token_id}")
    check(tokenizer.convert_tokens_to_ids("<|im_end|>") == SMOLLM2_EOS, "<|im_end|> is not id 2")
    smol_cases = []
    for q in QUESTIONS:
        text = tokenizer.apply_chat_template([{"role": "user", "content": q}],
                                             add_generation_prompt=True, tokenize=False)
        prompt = tokenizer(text)["input_ids"]
        generated, margins = greedy(model, prompt, SMOLLM2_NEW_TOKENS, SMOLLM2_EOS, SMOLLM2_EOS)
        m, step = summarize(margins)
        report.append(("smollm2", q, m, step))
        if m < MIN_MARGIN:
            dropped.append({"model": "smollm2", "prompt_ids": prompt, "min_margin": m, "step": step,
                            "reason": f"min top-2 logit margin {m:.3e} < {MIN_MARGIN}"})
            continue
        smol_cases.append({
            "question": q,
            "prompt_text": text,
            "prompt_ids": prompt,
            "generated_ids": generated,
            "generated_text": tokenizer.decode(generated),
            "stopped_at_eos": generated[-1] == SMOLLM2_EOS,
            "margins": rounded(margins),
            "min_margin": round(m, MARGIN_DECIMALS),
        })

    for d in dropped:
        d["min_margin"] = float(f"{d['min_margin']:.3e}")
    doc = {
        "generator": "tools/make_generate_fixtures.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "min_margin_threshold": MIN_MARGIN,
        "tiny": {"max_new_tokens": TINY_NEW_TOKENS, "eos_token_id": None, "pad_token_id": TINY_PAD,
                 "cases": tiny_cases},
        "smollm2": {"model": "smollm2-135m-instruct", "max_new_tokens": SMOLLM2_NEW_TOKENS,
                    "eos_token_id": SMOLLM2_EOS, "pad_token_id": SMOLLM2_EOS, "cases": smol_cases},
        "dropped": dropped,
    }
    text = json.dumps(doc, indent=1, ensure_ascii=False)
    # Lists of numbers on one line each: small and still readable.
    import re
    text = re.sub(r"\[\s*([-0-9.e,\s]+?)\s*\]",
                  lambda mt: "[" + ", ".join(x.strip() for x in mt.group(1).split(",")) + "]", text)
    check(json.loads(text) == doc, "compacted JSON differs")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text + "\n")
    size = OUT.stat().st_size
    check(size <= MAX_BYTES, f"{OUT} is {size} bytes > {MAX_BYTES}")

    for name, prompt, m, step in report:
        status = "kept" if m >= MIN_MARGIN else "DROPPED"
        print(f"{name:8s} prompt {prompt!s:40.40s} min margin {m:.4e} at step {step:2d}  {status}")
    for d in dropped:
        print(f"dropped: {d['model']} prompt_ids={d['prompt_ids']}: {d['reason']} (step {d['step']})")
    print(f"kept: tiny {len(tiny_cases)}, smollm2 {len(smol_cases)}; dropped {len(dropped)}")
    print(f"wrote {OUT} ({size} bytes)")


if __name__ == "__main__":
    main()
