"""An example user reward for grpo's `command` plug-in (see config.toml).

Rewards a completion that ends with the ground-truth number; skips rows without one.
"""

import re


def reward(prompt, completion, answer=None, **row):
    if answer is None:
        return None
    truth = str(answer).split("####")[-1].strip().replace(",", "")
    numbers = re.findall(r"-?\d+(?:\.\d+)?", completion.replace(",", ""))
    return 1.0 if numbers and numbers[-1] == truth else 0.0
