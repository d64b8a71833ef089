"""grpo environment plug-in helper: runs a user's Python environment for grpo's `command` environment.

Usage (grpo does this for `[environment] type = "command"`, `script = "my_env.py"`):

    python3 grpo_env_plugin.py my_env.py

The user file defines

    def step(messages, **row):
        ...

called after each model turn with every message so far (dicts with "role"
and "content", plus "tool_calls" on assistant turns that call tools:
[{"type": "function", "function": {"name": ..., "arguments": {...}}}]), the
model's latest turn last, and the data row's columns other than the prompt
as keyword arguments (accept **row so that new columns never break it; a
column named "messages" would clash with the first argument). It returns
one of:

    a string                       the episode goes on; the model reads it as a "user" message
    a message dict or a list of them ({"role": "user" | "tool" | ..., "content": "..."})
                                   the episode goes on with these messages
    {"messages": <any of the above>, "structured_outputs": {...}}
                                   the episode goes on, and the model's next turn is guided
                                   (vLLM's structured_outputs: {"json": schema}, {"regex": "..."},
                                   {"choice": [...]}, {"grammar": "..."} or {"json_object": True})
    a number (or a bool)           the episode ends with this reward
    None                           the episode ends without an environment reward
                                   (the run's [[reward]] tables score it)

Optionally the file also defines

    TOOLS = [...]                  the tools the model is offered, each OpenAI's
                                   {"type": "function", "function": {"name", "description", "parameters"}}
                                   or just the inner {"name", "description", "parameters"}

Keep `step` free of state between calls where you can: the messages and the
row carry the whole episode, so a restarted plug-in carries on.

Protocol (JSON lines; stdlib only):

    stdin:  {"id": 0, "method": "tools"}
    stdout: {"id": 0, "tools": [...]}
    stdin:  {"id": 1, "method": "step", "episode": 12, "row": {...}, "messages": [...]}
    stdout: {"id": 1, "messages": [...]}   or   {"id": 1, "done": true, "reward": 1.0}
            (with "structured_outputs": {...} when step asked for a guided next turn)
    stdin:  {"id": 2, "method": "end", "episode": 12}
    stdout: {"id": 2}

Anything the user's code prints goes to stderr, so stdout carries only
protocol lines. An exception in the user's code (or a return value of none
of the shapes above, or a non-finite reward) answers {"id", "error"} for
that step — grpo then applies the environment's `on_error` — and the helper
keeps serving.
"""

import importlib.util
import json
import math
import os
import sys
import traceback


def load(path):
    """Imports the user's environment file and returns its module."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    spec = importlib.util.spec_from_file_location("user_environment", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "step", None)):
        raise SystemExit(f"{path}: define step(messages, **row)")
    return module


def tools(module):
    """The file's TOOLS in OpenAI's shape."""
    listed = getattr(module, "TOOLS", [])
    return [tool if "function" in tool else {"type": "function", "function": tool} for tool in listed]


def answer(result):
    """The protocol answer to what step returned."""
    if result is None:
        return {"done": True, "reward": None}
    if isinstance(result, (bool, int, float)):
        reward = float(result)
        if not math.isfinite(reward):
            raise ValueError(f"step returned the reward {reward}; give a finite number, or None for no reward")
        return {"done": True, "reward": reward}
    if isinstance(result, dict) and "messages" in result:
        guided = answer(result["messages"])
        if "messages" not in guided:
            raise TypeError(f"step returned messages {result['messages']!r}; give a string, a message or a list of them")
        return dict(guided, structured_outputs=result.get("structured_outputs"))
    if isinstance(result, str):
        return {"messages": [{"role": "user", "content": result}]}
    if isinstance(result, dict):
        return {"messages": [result]}
    if isinstance(result, (list, tuple)) and result:
        return {"messages": list(result)}
    raise TypeError(
        f"step returned {result!r}; return a string, a message or a non-empty list of them to go on, "
        "a number or None to end the episode"
    )


def serve(module, request):
    """The answer to one request, without its id."""
    method = request.get("method")
    if method == "tools":
        return {"tools": tools(module)}
    if method == "step":
        return answer(module.step(request["messages"], **request["row"]))
    if method == "end":
        return {}
    raise ValueError(f"unknown method {method!r}")


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: grpo_env_plugin.py USER_ENVIRONMENT.py")
    protocol = sys.stdout
    sys.stdout = sys.stderr
    module = load(sys.argv[1])
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        try:
            text = json.dumps(dict(serve(module, request), id=request["id"]), allow_nan=False)
        except Exception as error:  # the user's code failed: report, keep serving
            traceback.print_exc(file=sys.stderr)
            text = json.dumps({"id": request["id"], "error": f"{type(error).__name__}: {error}"})
        protocol.write(text + "\n")
        protocol.flush()


if __name__ == "__main__":
    main()
