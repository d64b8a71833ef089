#!/usr/bin/env python3
"""LoRA fixtures both ways between grpo and PEFT, on the tiny parity models
(model/tests/fixtures/parity/<family>, made by tools/make_parity_fixtures.py).

PEFT-made: for llama (every linear layer), qwen2 (q_proj and v_proj over
biased projections, rsLoRA) and phi3 (its fused qkv_proj and gate_up_proj),
PEFT adds adapters whose A and B are drawn from a fixed seed (B nonzero, so
the adapters change the model) and saves them with `save_pretrained`; the
expected per-token log-probabilities on the parity inputs, and the
gradients of the masked log-probability sum with respect to every adapter
tensor, are computed by PEFT in float64. Written to
model/tests/fixtures/lora/<family>/{adapter/, expected.safetensors}.

grpo-made: with `--grpo-made GRPO` (the grpo binary), the script trains
LoRA adapters (rank 4 on q_proj, v_proj and down_proj) on the llama parity
model with the tiny fixture tokenizer by three steps of `grpo sft`, copies
the adapter folder grpo wrote to model/tests/fixtures/lora/grpo_made/adapter
(its base_model_name_or_path made the parity model's path from the
repository root), loads it with `PeftModel.from_pretrained` and writes the
log-probabilities PEFT gives for it on the parity inputs, in float64, to
model/tests/fixtures/lora/grpo_made/peft_expected.safetensors.

Regenerate (from the repository root; tools/venv.sh installs torch,
transformers, safetensors and PEFT and prints its python):

    "$(tools/venv.sh)" tools/make_lora_fixtures.py
    cargo build && "$(tools/venv.sh)" tools/make_lora_fixtures.py --grpo-made target/debug/grpo

The output is deterministic (CPU, fixed seeds).
"""

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import peft
import safetensors.torch
import torch
import transformers
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parent.parent
PARITY = ROOT / "model" / "tests" / "fixtures" / "parity"
OUT = ROOT / "model" / "tests" / "fixtures" / "lora"
ADAPTER_STD = 0.2

FAMILIES = {
    "llama": dict(r=4, lora_alpha=8, target_modules="all-linear", seed=10),
    "qwen2": dict(r=2, lora_alpha=3, target_modules=["q_proj", "v_proj"], use_rslora=True, seed=11),
    "phi3": dict(r=4, lora_alpha=16, target_modules="all-linear", seed=12),
}


def check(cond, msg):
    if not cond:
        print(f"make_lora_fixtures.py: {msg}", file=sys.stderr)
        sys.exit(1)


def inputs(family):
    spec = json.loads((PARITY / family / "inputs.json").read_text())
    return torch.tensor(spec["input_ids"]), torch.tensor(spec["attention_mask"])


def base_model(family):
    return AutoModelForCausalLM.from_pretrained(
        PARITY / family, attn_implementation="eager", dtype=torch.float32
    ).eval()


def masked_logprobs(model, input_ids, attention_mask):
    """Per-token log-probs [B, T-1] and their mask."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    logp = torch.log_softmax(logits[:, :-1, :], dim=-1)
    logprobs = logp.gather(-1, input_ids[:, 1:, None])[..., 0]
    return logprobs, attention_mask[:, 1:].to(logprobs.dtype)


def saved_name(name):
    """A PEFT parameter name as save_pretrained stores it (no adapter name)."""
    return name.replace(".default.", ".")


def peft_made(family, settings):
    settings = dict(settings)
    seed = settings.pop("seed")
    input_ids, attention_mask = inputs(family)
    model = get_peft_model(base_model(family), LoraConfig(task_type="CAUSAL_LM", lora_dropout=0.0, **settings))
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(ADAPTER_STD * torch.randn_like(p))
    d = OUT / family
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    model.save_pretrained(d / "adapter")
    check(sorted(p.name for p in (d / "adapter").iterdir()) == ["README.md", "adapter_config.json", "adapter_model.safetensors"],
          f"save_pretrained wrote {sorted(p.name for p in (d / 'adapter').iterdir())}")
    (d / "adapter" / "README.md").unlink()  # PEFT's model card template: nothing grpo reads
    # The base as a path from the repository root, not this checkout's absolute one.
    config_path = d / "adapter" / "adapter_config.json"
    adapter_config = json.loads(config_path.read_text())
    adapter_config["base_model_name_or_path"] = str((PARITY / family).relative_to(ROOT))
    config_path.write_text(json.dumps(adapter_config, indent=2, sort_keys=True) + "\n")

    model64 = model.to(torch.float64)
    lora = {n: p for n, p in model64.named_parameters() if "lora_" in n}
    check(lora and all(p.requires_grad for p in lora.values()), "adapters are trainable")
    logprobs, mask = masked_logprobs(model64, input_ids, attention_mask)
    (logprobs * mask).sum().backward()
    tensors = {"logprobs": logprobs.detach().float().contiguous(), "mask": mask.float().contiguous()}
    for n, p in lora.items():
        check(p.grad is not None and p.grad.norm() > 0, f"{family}: no gradient for {n}")
        tensors[f"grad.{saved_name(n)}"] = p.grad.float().contiguous()
    # The base model alone, for the adapters-off check.
    with model64.disable_adapter(), torch.no_grad():
        base, _ = masked_logprobs(model64, input_ids, attention_mask)
    tensors["base_logprobs"] = base.float().contiguous()
    check((base - logprobs).abs().max() > 1e-2, f"{family}: the adapters barely change the model")
    safetensors.torch.save_file(tensors, d / "expected.safetensors", metadata={
        "generator": f"tools/make_lora_fixtures.py family={family} peft={peft.__version__} "
                     f"transformers={transformers.__version__} torch={torch.__version__}",
    })
    with safetensors.safe_open(d / "adapter" / "adapter_model.safetensors", framework="pt") as f:
        check(set(f.keys()) == {saved_name(n) for n in lora}, f"{family}: saved names {sorted(f.keys())}")
    print(f"{family}: {len(lora)} adapter tensors", file=sys.stderr)


SFT_CONFIG = """[model]
name = "model"

[data]
path = "data.jsonl"
eval_size = 0

[optimizer]
lr = 1e-2

[trainer]
max_steps = 3
batch_size = 4
micro_batch_size = 4
eval_every = 0
max_length = 24

[checkpoint]
every = 0

[logging]
out = "out"

[lora]
rank = 4
alpha = 8
target_modules = ["q_proj", "v_proj", "down_proj"]
seed = 1
"""


def grpo_made(grpo):
    grpo = Path(grpo).resolve()
    target = OUT / "grpo_made"
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "model").mkdir()
        for name in ("config.json", "model.safetensors"):
            shutil.copy(PARITY / "llama" / name, tmp / "model" / name)
        tokenizer = ROOT / "model" / "tests" / "fixtures" / "tokenizer" / "tiny"
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(tokenizer / name, tmp / "model" / name)
        rows = [{"prompt": f"{i} + 1 =", "completion": f" {i + 1}."} for i in range(8)]
        (tmp / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (tmp / "sft.toml").write_text(SFT_CONFIG)
        subprocess.run([str(grpo), "sft", "sft.toml"], check=True, cwd=tmp)
        if target.exists():
            shutil.rmtree(target)
        (target / "adapter").mkdir(parents=True)
        for name in ("adapter_config.json", "adapter_model.safetensors"):
            shutil.copy(tmp / "out" / "final" / name, target / "adapter" / name)
    config_path = target / "adapter" / "adapter_config.json"
    adapter_config = json.loads(config_path.read_text())
    check(adapter_config["base_model_name_or_path"] == "model", f"grpo recorded {adapter_config}")
    adapter_config["base_model_name_or_path"] = str((PARITY / "llama").relative_to(ROOT))
    config_path.write_text(json.dumps(adapter_config, indent=2) + "\n")

    input_ids, attention_mask = inputs("llama")
    model = PeftModel.from_pretrained(base_model("llama"), target / "adapter").to(torch.float64).eval()
    lora = {n: p for n, p in model.named_parameters() if "lora_" in n}
    check(len(lora) == 2 * 3 * 2, f"PEFT made {sorted(lora)}")
    check(any(p.abs().max() > 0 for n, p in lora.items() if "lora_B" in n), "grpo's training moved B")
    with torch.no_grad():
        logprobs, mask = masked_logprobs(model, input_ids, attention_mask)
        with model.disable_adapter():
            base, _ = masked_logprobs(model, input_ids, attention_mask)
    check((base - logprobs).abs().max() > 1e-4, "the trained adapters change the model")
    safetensors.torch.save_file(
        {"logprobs": logprobs.float().contiguous(), "mask": mask.float().contiguous()},
        target / "peft_expected.safetensors",
        metadata={"generator": f"tools/make_lora_fixtures.py --grpo-made peft={peft.__version__} "
                               f"transformers={transformers.__version__} torch={torch.__version__}"},
    )
    print(f"PEFT loaded {target / 'adapter'}", file=sys.stderr)


def main():
    torch.use_deterministic_algorithms(True)
    if sys.argv[1:2] == ["--grpo-made"] and len(sys.argv) == 3:
        grpo_made(sys.argv[2])
        return
    check(len(sys.argv) == 1, "usage: make_lora_fixtures.py [--grpo-made GRPO_BINARY]")
    for family, settings in FAMILIES.items():
        peft_made(family, settings)


if __name__ == "__main__":
    main()
