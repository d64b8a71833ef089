"""Load generator of the serving benchmark (bench/serve.sh): streams
completions from an OpenAI-compatible server at several concurrency levels
and measures what `vllm bench serve` reports.

Per request: TTFT = time to the first chunk carrying text, TPOT = (last text
chunk - first) / (output tokens - 1), output tokens from the final usage
chunk (stream_options.include_usage). Per level: median and p90 of TTFT and
TPOT (ms), output tokens/s = all output tokens / wall time of the level.
Each level starts with an untimed warm-up burst (4 tokens a request) so
that XLA compiles its batch shapes outside the measurement.
Prints one JSON line per level on stdout and a table on stderr. Needs the
official `openai` client (tools/test-venv.sh).

Usage: serve_load.py --base-url http://127.0.0.1:PORT --model NAME
                     [--concurrency 1,8,32] [--requests-per-level N] [--max-tokens 64]
"""

import argparse
import asyncio
import json
import statistics
import sys
import time

import openai

PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle stays upright.",
    "List some facts about the moon.",
    "Describe a walk through a forest in autumn.",
    "What makes bread rise?",
    "Give advice to a new gardener.",
    "Tell me about the history of the printing press.",
    "Why is the sky blue?",
]


def quantile(values, q):
    values = sorted(values)
    if not values:
        return float("nan")
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


async def one_request(client, model, prompt, max_tokens):
    start = time.perf_counter()
    first = last = None
    tokens = 0
    stream = await client.completions.create(
        model=model, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            now = time.perf_counter()
            first = first if first is not None else now
            last = now
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    if first is None:
        raise RuntimeError(f"no text streamed for {prompt!r}")
    ttft = first - start
    tpot = (last - first) / (tokens - 1) if tokens > 1 else float("nan")
    return ttft, tpot, tokens


async def level(client, model, concurrency, requests, max_tokens):
    queue = list(range(requests))
    results = []

    async def worker():
        while queue:
            i = queue.pop()
            results.append(await one_request(client, model, PROMPTS[i % len(PROMPTS)], max_tokens))

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    ttfts = [r[0] * 1e3 for r in results]
    tpots = [r[1] * 1e3 for r in results]
    tokens = sum(r[2] for r in results)
    return {
        "bench": "serve", "concurrency": concurrency, "requests": requests, "max_tokens": max_tokens,
        "output_tokens": tokens, "wall_s": round(wall, 3),
        "output_tokens_per_s": round(tokens / wall, 2),
        "ttft_ms_median": round(statistics.median(ttfts), 2), "ttft_ms_p90": round(quantile(ttfts, 0.9), 2),
        "tpot_ms_median": round(statistics.median(tpots), 2), "tpot_ms_p90": round(quantile(tpots, 0.9), 2),
    }


async def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--api-key", default="none")
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--requests-per-level", type=int, default=0,
                        help="requests per level (default: 2 x concurrency, at least 4)")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    client = openai.AsyncOpenAI(base_url=f"{args.base_url}/v1", api_key=args.api_key, max_retries=0, timeout=600)
    rows = []
    for c in (int(x) for x in args.concurrency.split(",")):
        n = args.requests_per_level or max(4, 2 * c)
        # Untimed warm-up at the level's concurrency: compiles the prefill and
        # decode programs of its batch shapes before anything is timed.
        await level(client, args.model, c, max(c, len(PROMPTS)), 4)
        row = await level(client, args.model, c, n, args.max_tokens)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"{'conc':>5} {'reqs':>5} {'TTFT ms p50':>12} {'TTFT p90':>9} {'TPOT ms p50':>12} {'TPOT p90':>9} "
          f"{'out tok/s':>10}", file=sys.stderr)
    for r in rows:
        print(f"{r['concurrency']:>5} {r['requests']:>5} {r['ttft_ms_median']:>12.1f} {r['ttft_ms_p90']:>9.1f} "
              f"{r['tpot_ms_median']:>12.1f} {r['tpot_ms_p90']:>9.1f} {r['output_tokens_per_s']:>10.1f}",
              file=sys.stderr)
    await client.close()


if __name__ == "__main__":
    asyncio.run(main())
