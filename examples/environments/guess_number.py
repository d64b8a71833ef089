"""A number-guessing game as a grpo environment plug-in (run by grpo_env_plugin.py).

    [environment]
    type = "command"
    script = "guess_number.py"

Each data row has an integer column `secret` and optionally `low` and `high`
(default 1 and 100). The last number in each model turn is its guess; the
game answers "Higher." or "Lower." and ends with reward 1.0 when the guess is
right. A turn without a whole number in the range is asked for one. This is
what the built-in `type = "guess"` environment does, written as a plug-in.
"""

import re

NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?|\d+(?:\.\d+)?")


def last_whole_number(text):
    """The last number in `text` if it is whole, else None."""
    numbers = NUMBER.findall(text)
    if not numbers or "." in numbers[-1]:
        return None
    return int(numbers[-1])


def step(messages, secret, low=1, high=100, **row):
    guess = last_whole_number(messages[-1]["content"])
    if guess is None or not low <= guess <= high:
        return f"Say a whole number between {low} and {high}."
    if guess < secret:
        return "Higher."
    if guess > secret:
        return "Lower."
    return 1.0
