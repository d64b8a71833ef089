"""grpo reward plug-in helper: runs a user's Python reward for grpo's `command` plug-in.

Usage (grpo does this for `[[reward]] type = "command"`, `script = "my_reward.py"`):

    python3 grpo_reward_plugin.py my_reward.py

The user file defines either, per sample,

    def reward(prompt, completion, **row) -> float | None

or, batched (TRL's contract),

    def rewards(prompts, completions, completion_ids, **columns) -> list[float | None]

`prompt` is the chat messages (a list of {"role", "content"}) when the sample
has them, else the prompt text. `row` holds the dataset row's other columns
(e.g. `answer`) plus `completion_ids` and `group_id`; accept `**row` so that
new columns never break the function. In the batched form every column is a
list with one value per sample. Returning None skips the sample.

Protocol (JSON lines; stdlib only):

    stdin:  {"id": 7, "samples": [{"id", "group_id", "prompt", "messages", "completion",
                                   "completion_ids", "row"}, ...]}
    stdout: {"id": 7, "scores": [1.0, null, ...]}   or   {"id": 7, "error": "..."}

Non-finite scores are sent as the strings "nan", "inf" and "-inf". Anything
the user's code prints goes to stderr, so stdout carries only protocol lines.
An exception in the user's code answers {"error"} for that batch (grpo then
applies the reward's `on_error`) and the helper keeps serving.
"""

import importlib.util
import json
import math
import sys
import traceback


def load(path):
    """Imports the user's reward file and returns its module."""
    spec = importlib.util.spec_from_file_location("user_reward", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "reward") and not hasattr(module, "rewards"):
        raise SystemExit(f"{path}: define reward(prompt, completion, **row) or rewards(prompts, completions, **columns)")
    return module


def wire(score):
    """A score as JSON can carry it: a float, None, or a string for non-finite values."""
    if score is None:
        return None
    score = float(score)
    if math.isnan(score):
        return "nan"
    if math.isinf(score):
        return "inf" if score > 0 else "-inf"
    return score


def prompt_of(sample):
    return sample["messages"] or sample["prompt"]


def keywords(sample):
    return dict(sample["row"], completion_ids=sample["completion_ids"], group_id=sample["group_id"])


def score(module, samples):
    """The scores of one batch, through the batched function when there is one."""
    if hasattr(module, "rewards"):
        columns = {}
        for sample in samples:
            for key in keywords(sample):
                columns.setdefault(key, [])
        for sample in samples:
            row = keywords(sample)
            for key, values in columns.items():
                values.append(row.get(key))
        scores = module.rewards([prompt_of(s) for s in samples], [s["completion"] for s in samples], **columns)
        return [wire(s) for s in scores]
    return [wire(module.reward(prompt_of(s), s["completion"], **keywords(s))) for s in samples]


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: grpo_reward_plugin.py USER_REWARD.py")
    protocol = sys.stdout
    sys.stdout = sys.stderr
    module = load(sys.argv[1])
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        try:
            answer = {"id": request["id"], "scores": score(module, request["samples"])}
        except Exception as error:  # the user's code failed: report, keep serving
            traceback.print_exc(file=sys.stderr)
            answer = {"id": request["id"], "error": f"{type(error).__name__}: {error}"}
        protocol.write(json.dumps(answer) + "\n")
        protocol.flush()


if __name__ == "__main__":
    main()
