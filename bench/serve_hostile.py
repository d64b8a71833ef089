"""Hostile-load benchmark of an OpenAI-compatible server (bench/serve.sh with
LOAD=hostile): 32 well-behaved clients stream short completions in a loop
while /health is probed every 50 ms — first alone, then beside one abusive
client that sends, each over and over on its own connection, the largest
request the limits take (prompts x n at the sample limit), a request of
10,000 stop strings, a 7 MB prompt, and a request of 20,000 prompts x n = 8.

Reports per phase the p50 / p99 latency (ms) of the well-behaved requests
and of /health, their counts, and what the abusive requests were answered
(status counts). Loopback only; each phase stops after --seconds. Prints
one JSON line per phase on stdout and a table on stderr. Needs the HTTP
client the official `openai` client depends on (tools/test-venv.sh).

Usage: serve_hostile.py --base-url http://127.0.0.1:PORT --model NAME
                        [--clients 32] [--seconds 30] [--max-tokens 16]
                        [--max-samples 4096]
"""

import argparse
import asyncio
import collections
import json
import sys
import time

try:  # the HTTP client the official `openai` client depends on
    import httpx2 as httpx
except ImportError:
    import httpx

from serve_load import quantile  # bench/ is the script's folder

PROMPTS = ["Why is the sky blue?", "What makes bread rise?", "List some facts about the moon.",
           "Explain how a bicycle stays upright."]


async def well_behaved(client, model, max_tokens, until, latencies, failures):
    i = 0
    while time.perf_counter() < until:
        body = {"model": model, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": max_tokens,
                "temperature": 0, "ignore_eos": True, "stream": True}
        start = time.perf_counter()
        try:
            async with client.stream("POST", "/v1/completions", json=body) as response:
                async for _ in response.aiter_lines():
                    pass
                ok = response.status_code == 200
        except httpx.HTTPError:
            ok = False
        (latencies if ok else failures).append((time.perf_counter() - start) * 1e3)
        i += 1


async def health(client, until, latencies):
    while time.perf_counter() < until:
        start = time.perf_counter()
        try:
            response = await client.get("/health")
            if response.status_code == 200:
                latencies.append((time.perf_counter() - start) * 1e3)
        except httpx.HTTPError:
            latencies.append(float("inf"))
        await asyncio.sleep(0.05)


def abusive_bodies(model, max_samples):
    n = 8
    yield "at the sample limit", {"model": model, "prompt": ["Tell me a story."] * (max_samples // n), "n": n,
                                  "max_tokens": 16, "ignore_eos": True}
    yield "10,000 stop strings", {"model": model, "prompt": "hi", "stop": [f"s{i}" for i in range(10_000)]}
    yield "a 7 MB prompt", {"model": model, "prompt": "word " * ((7 << 20) // 5), "max_tokens": 1}
    yield "20,000 prompts x n = 8", {"model": model, "prompt": ["hi"] * 20_000, "n": 8, "max_tokens": 16}


async def abusive(client, name, body, until, answers):
    while time.perf_counter() < until:
        try:
            response = await client.post("/v1/completions", json=body)
            answers[f"{name}: {response.status_code}"] += 1
        except httpx.HTTPError as e:
            answers[f"{name}: {type(e).__name__}"] += 1


async def phase(base_url, args, with_abuse):
    limits = httpx.Limits(max_connections=args.clients + 8)
    async with httpx.AsyncClient(base_url=base_url, timeout=600, limits=limits) as client, \
            httpx.AsyncClient(base_url=base_url, timeout=600) as abuser, \
            httpx.AsyncClient(base_url=base_url, timeout=600) as prober:
        until = time.perf_counter() + args.seconds
        latencies, failures, probes = [], [], []
        answers = collections.Counter()
        tasks = [well_behaved(client, args.model, args.max_tokens, until, latencies, failures)
                 for _ in range(args.clients)]
        tasks.append(health(prober, until, probes))
        if with_abuse:
            tasks += [abusive(abuser, name, body, until, answers)
                      for name, body in abusive_bodies(args.model, args.max_samples)]
        await asyncio.gather(*tasks)
    return {
        "bench": "serve_hostile", "abusive_client": with_abuse, "clients": args.clients, "seconds": args.seconds,
        "requests": len(latencies), "failed": len(failures),
        "latency_ms_p50": round(quantile(latencies, 0.5), 1), "latency_ms_p99": round(quantile(latencies, 0.99), 1),
        "health_probes": len(probes), "health_ms_p50": round(quantile(probes, 0.5), 1),
        "health_ms_p99": round(quantile(probes, 0.99), 1), "health_ms_max": round(max(probes, default=0), 1),
        "abusive_answers": dict(answers),
    }


async def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--max-samples", type=int, default=4096, help="the server's --max-samples-per-request")
    args = parser.parse_args()
    if not args.base_url.startswith(("http://127.", "http://localhost")):
        sys.exit("serve_hostile.py: loopback servers only")
    # Untimed warm-up: compiles the batch shapes the phases use.
    async with httpx.AsyncClient(base_url=args.base_url, timeout=600) as client:
        await asyncio.gather(*(client.post("/v1/completions", json={
            "model": args.model, "prompt": p, "max_tokens": args.max_tokens, "ignore_eos": True})
            for p in PROMPTS * (args.clients // len(PROMPTS))))
    rows = []
    for with_abuse in (False, True):
        row = await phase(args.base_url, args, with_abuse)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"{'abusive client':>15} {'requests':>9} {'p50 ms':>8} {'p99 ms':>8} {'/health p50':>12} "
          f"{'p99':>6} {'max':>7}", file=sys.stderr)
    for r in rows:
        print(f"{('yes' if r['abusive_client'] else 'no'):>15} {r['requests']:>9} {r['latency_ms_p50']:>8.0f} "
              f"{r['latency_ms_p99']:>8.0f} {r['health_ms_p50']:>12.1f} {r['health_ms_p99']:>6.1f} "
              f"{r['health_ms_max']:>7.1f}", file=sys.stderr)
    print(f"abusive requests answered: {rows[1]['abusive_answers']}", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main())
