#!/usr/bin/env python3
"""TRL's side of bench/grpo_loop.sh: S steps of TRL's GRPOTrainer on the arithmetic example.

The issue's reference setup: SmolLM2-135M-Instruct (grpo's converted folder,
<grpo cache>/models/smollm2-135m-instruct) in f32 on the CPU, the chat prompts
of examples/arithmetic/data.jsonl less the held-out rows grpo keeps for eval
(the same split: data.rs's SplitMix64 shuffle with seed 0, eval_size 200),
8 prompts x 8 samples = 64 sequences per step, at most 32 new tokens, lr 1e-5,
beta 0, loss_type "dapo", temperature 1.0, use_vllm False, report_to none,
logging every step; otherwise GRPOConfig's defaults (gradient checkpointing on,
linear lr decay, epsilon 0.2, top_p 1). bf16 is off (f32) and the 64 sequences
go through in micro-batches of 16 with 4 accumulation steps, as grpo's
`trainer.micro_batch_size = 16` does (gcd(16, prompts x samples) for smaller
smoke-test batches), so one optimizer step = one generation of the batch.

Reward: grpo's `math` reward cut down to what these prompts need: the number in
the last "answer is ..." of the completion, else the completion's last number
(thousands separators dropped), equal to `answer` as an exact fraction -> 1.0,
else 0.0.

Prints on stdout one JSON line per step,
  {"bench": "grpo_loop", "system": "trl", "round": n, "step": k, "step_time": s, "reward": r,
   "peak_rss_bytes": b}
(step_time from a TrainerCallback's on_step_begin to on_step_end: generation,
reward, forward/backward of every micro-batch and the optimizer step; peak_rss_bytes
the process's peak resident memory so far, as grpo's metric of that name), a first
{"bench": "grpo_loop", "system": "trl", "round": n, "info": {...}} line with the versions
and the batch layout, and with --eval a greedy accuracy on the held-out rows
before and after training ({"eval_step": 0|S, "eval_accuracy", "eval_time"}).
Everything else (TRL's own logs) goes to stderr.
"""

import argparse
import json
import math
import os
import re
import resource
import sys
import time
from fractions import Fraction

MASK64 = (1 << 64) - 1


def splitmix64_order(n, seed):
    """data.rs's shuffle of range(n): SplitMix64(seed ^ 0xE7A1), Fisher-Yates from the end."""
    state = (seed ^ 0xE7A1) & MASK64
    order = list(range(n))
    for i in range(n - 1, 0, -1):
        state = (state + 0x9E3779B97F4A7C15) & MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        z ^= z >> 31
        j = z % (i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def split_rows(rows, eval_size, seed=0):
    """(train, eval) as grpo's data::split: `eval_size` rows held out, both in file order."""
    if eval_size >= len(rows):
        raise ValueError(f"eval_size {eval_size} leaves nothing of {len(rows)} rows to train on")
    held = set(splitmix64_order(len(rows), seed)[:eval_size])
    train = [r for i, r in enumerate(rows) if i not in held]
    evals = [r for i, r in enumerate(rows) if i in held]
    return train, evals


NUMBER = re.compile(r"-?(?:\d+(?:\.\d+)?|\.\d+)(?:/(?:\d+(?:\.\d+)?|\.\d+))?")
ANSWER_IS = re.compile(r"(?i)answer\s+is\s*:?\s*([^\n]*)")
THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def _fraction(text):
    try:
        num, _, den = text.partition("/")
        return Fraction(num) / Fraction(den or "1")
    except (ValueError, ZeroDivisionError):
        return None


def extract_answer(completion):
    """The number in the last "answer is ..." (else the last number of the completion), or None."""
    text = THOUSANDS.sub("", completion)
    tails = ANSWER_IS.findall(text)
    if tails:
        found = NUMBER.search(tails[-1])
        if found:
            return found.group()
    numbers = NUMBER.findall(text)
    return numbers[-1] if numbers else None


def math_score(completion, answer):
    """1.0 if the completion's final number equals `answer` exactly, else 0.0."""
    found = extract_answer(completion)
    if found is None:
        return 0.0
    got, want = _fraction(found), _fraction(str(answer).strip())
    return 1.0 if got is not None and got == want else 0.0


def _text(completion):
    """A completion as TRL hands it: a string, or (chat prompts) a list of messages."""
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content", "") for m in completion if isinstance(m, dict))


def math_reward(completions, answer, **_):
    """TRL reward function: one 0/1 score per completion."""
    return [math_score(_text(c), a) for c, a in zip(completions, answer)]


def batch_layout(prompts, samples, micro=16):
    """(per-device micro-batch, gradient accumulation steps) for prompts x samples sequences a step."""
    total = prompts * samples
    rows = math.gcd(micro, total)
    return rows, total // rows


def peak_rss_bytes():
    """This process's peak resident memory so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def step_line(step, seconds, reward, round_=1, peak=None):
    line = {"bench": "grpo_loop", "system": "trl", "round": round_, "step": step, "step_time": seconds,
            "reward": reward}
    if peak is not None:
        line["peak_rss_bytes"] = peak
    return json.dumps(line)


def load_rows(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def parse_args(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    from model_step_torch import default_model_dir  # torch-free

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", default=default_model_dir())
    p.add_argument("--data", default=os.path.join(here, "..", "examples", "arithmetic", "data.jsonl"))
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--prompts", type=int, default=8, help="prompts per step")
    p.add_argument("--samples", type=int, default=8, help="samples per prompt (num_generations)")
    p.add_argument("--max-tokens", type=int, default=32, help="max_completion_length")
    p.add_argument("--eval-size", type=int, default=200, help="held-out rows (grpo's data.eval_size)")
    p.add_argument("--eval", action="store_true", help="greedy accuracy on the held-out rows at start and end")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--seed", type=int, default=42, help="TRL's seed (GRPOConfig's default)")
    p.add_argument("--round", type=int, default=1, help="the round number written into the lines")
    args = p.parse_args(argv)
    for name in ("steps", "prompts", "max_tokens", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.samples < 2:
        p.error("--samples must be >= 2 (GRPO needs a group)")
    return args


def greedy_accuracy(model, tokenizer, rows, max_tokens, batch=64):
    """Share of `rows` whose greedy completion (at most `max_tokens`) scores 1, and the seconds it took."""
    import torch

    started = time.perf_counter()
    was_training = model.training
    model.eval()
    hits = 0
    tokenizer.padding_side = "left"
    with torch.no_grad():
        for i in range(0, len(rows), batch):
            chunk = rows[i : i + batch]
            texts = [tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in chunk]
            enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            out = model.generate(
                **enc, max_new_tokens=max_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id,
                use_cache=True,
            )
            completions = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            hits += sum(math_score(c, r["answer"]) for c, r in zip(completions, chunk))
    if was_training:
        model.train()
    return hits / max(len(rows), 1), time.perf_counter() - started


def main(argv=None):
    args = parse_args(argv)
    out = sys.stdout
    sys.stdout = sys.stderr  # TRL's and transformers' prints must not mix with the JSON lines

    def emit(obj):
        print(obj if isinstance(obj, str) else json.dumps(obj), file=out, flush=True)

    if not os.path.isfile(os.path.join(args.model_dir, "config.json")):
        print(f"grpo_loop_trl.py: no model at {args.model_dir}; create it with `cargo run --release -- setup`",
              file=sys.stderr)
        return 1

    import tempfile

    import accelerate
    import datasets
    import torch
    import transformers
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    rows = load_rows(args.data)
    train_rows, eval_rows = split_rows(rows, args.eval_size)
    micro, accumulation = batch_layout(args.prompts, args.samples)
    print(f"== TRL {trl.__version__} GRPOTrainer (transformers {transformers.__version__}, torch {torch.__version__}, "
          f"{args.threads} threads): {args.prompts} prompts x {args.samples} samples, micro-batch {micro} x "
          f"{accumulation}, {args.max_tokens} new tokens, {args.steps} steps", file=sys.stderr)

    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    dataset = datasets.Dataset.from_list([{"prompt": r["prompt"], "answer": str(r["answer"])} for r in train_rows])

    class StepTimer(TrainerCallback):
        """Times each optimizer step; prints its line once the step's logs (with the reward) arrive."""

        def __init__(self):
            self.started = None
            self.seconds = {}

        def on_step_begin(self, args_, state, control, **kwargs):
            self.started = time.perf_counter()

        def on_step_end(self, args_, state, control, **kwargs):
            self.seconds[state.global_step] = time.perf_counter() - self.started

        def on_log(self, args_, state, control, logs=None, **kwargs):
            if logs and "reward" in logs and state.global_step in self.seconds:
                emit(step_line(state.global_step, self.seconds.pop(state.global_step), float(logs["reward"]),
                               args.round, peak_rss_bytes()))

    with tempfile.TemporaryDirectory(prefix="grpo-loop-trl-") as work:
        config = GRPOConfig(
            output_dir=work,
            max_steps=args.steps,
            per_device_train_batch_size=micro,
            gradient_accumulation_steps=accumulation,
            num_generations=args.samples,
            max_completion_length=args.max_tokens,
            learning_rate=1e-5,
            beta=0.0,
            loss_type="dapo",
            temperature=1.0,
            use_vllm=False,
            bf16=False,
            use_cpu=True,
            report_to="none",
            logging_steps=1,
            save_strategy="no",
            disable_tqdm=True,
            seed=args.seed,
        )
        emit({"bench": "grpo_loop", "system": "trl", "round": args.round, "info": {
            "trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__,
            "accelerate": accelerate.__version__, "datasets": datasets.__version__, "threads": args.threads,
            "prompts": args.prompts, "samples": args.samples, "max_tokens": args.max_tokens,
            "micro_batch": micro, "accumulation": accumulation,
            "gradient_checkpointing": bool(config.gradient_checkpointing), "loss_type": config.loss_type,
            "lr_scheduler": getattr(config.lr_scheduler_type, "value", str(config.lr_scheduler_type)), "train_rows": len(train_rows),
            "eval_rows": len(eval_rows)}})
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=math_reward,
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[StepTimer()],
        )
        eval_tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
        if args.eval:
            accuracy, seconds = greedy_accuracy(trainer.model, eval_tokenizer, eval_rows, args.max_tokens)
            emit({"bench": "grpo_loop", "system": "trl", "round": args.round, "eval_step": 0, "eval_accuracy": accuracy, "eval_time": seconds})
        trainer.train()
        if args.eval:
            accuracy, seconds = greedy_accuracy(trainer.model, eval_tokenizer, eval_rows, args.max_tokens)
            emit({"bench": "grpo_loop", "system": "trl", "round": args.round, "eval_step": args.steps, "eval_accuracy": accuracy,
                  "eval_time": seconds})
    return 0


if __name__ == "__main__":
    sys.exit(main())
