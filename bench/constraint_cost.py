#!/usr/bin/env python3
"""What constrained decoding costs per token, against a running swiftlet-server.

Usage: bench/constraint_cost.py PORT [--rounds N] [--max-tokens N] [--temperature T] [--wait S]

Each round sends, for each of two schemas, an unconstrained chat request and one whose
response_format is that schema, first with a prompt new to the round, then with the first
round's prompt again (its answer path, and so its masks, seen before). The per-token decode time
(decode_ms over the tokens after the first) and the sampling time (sample_ms per token) come
from the server's own timings. Rounds after the first are averaged; the first warms the
grammar cache and the GPU. Prints one table, and the constraint's share of a step.
"""
import argparse
import json
import statistics
import sys
import time
import urllib.error
import urllib.request

SCHEMAS = {
    "bounds+enum": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 40},
            "unit": {"enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
            "hourly": {"type": "boolean"},
        },
        "required": ["city", "unit", "days"],
    },
    "formats+nested": {
        "type": "object",
        "properties": {
            "contact": {"type": "string", "format": "email"},
            "when": {"type": "string", "format": "date-time"},
            "items": {
                "type": "array",
                "maxItems": 4,
                "items": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "qty": {"type": "integer", "minimum": 0}},
                    "required": ["name", "qty"],
                },
            },
        },
        "required": ["contact", "when", "items"],
    },
}


def post(port, body):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        sys.exit(f"constraint_cost: the server answered {e.code}: {e.read().decode(errors='replace')}")
    except urllib.error.URLError as e:
        sys.exit(f"constraint_cost: no server on port {port} ({e.reason}); start swiftlet-server first")


def served_model(port, wait_s):
    """The served model's name, once the server has loaded it (waits up to wait_s)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30):
                pass
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30) as r:
                return json.load(r)["data"][0]["id"]
        except (urllib.error.URLError, OSError) as e:
            if time.monotonic() > deadline:
                sys.exit(f"constraint_cost: no server ready on port {port} ({e}); start swiftlet-server first")
            time.sleep(1)


def one(port, args, prompt, schema):
    body = {
        "model": args.model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "seed": 7,
    }
    if schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    r = post(port, body)
    t = r["timings"]
    n = r["usage"]["completion_tokens"]
    if n < 2:
        return None
    return {"ms": t["decode_ms"] / (n - 1), "sample_ms": t["sample_ms"] / n, "tokens": n}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("port", type=int)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--wait", type=float, default=600, help="seconds to wait for the server to load its model")
    args = ap.parse_args()
    if args.rounds < 2:
        sys.exit("constraint_cost: --rounds must be at least 2 (the first only warms up)")
    args.model = served_model(args.port, args.wait)

    rows = {}  # (kind, prompt) -> list of results
    for rnd in range(args.rounds):
        for name, schema in SCHEMAS.items():
            for which, prompt in (("new", f"Round {rnd}: plan a trip, as JSON ({name})."),
                                  ("reused", f"Round 0: plan a trip, as JSON ({name}).")):
                for kind, s in (("free", None), ("constrained", schema)):
                    res = one(args.port, args, prompt, s)
                    if res is not None and rnd > 0:
                        rows.setdefault((kind, which), []).append(res)

    def mean(kind, which, key):
        vals = [r[key] for w in which for r in rows.get((kind, w), [])]
        return statistics.mean(vals) if vals else float("nan")

    mode = "greedy" if args.temperature <= 0 else f"temperature {args.temperature}"
    print(f"constraint cost, {mode}, {args.max_tokens} max tokens, rounds 2-{args.rounds}")
    print(f"{'prompt':<8} {'free ms/tok':>12} {'constr. ms/tok':>15} {'cost':>7} {'free sample':>12} {'constr. sample':>15}")
    for label, which in (("new", ["new"]), ("reused", ["reused"]), ("all", ["new", "reused"])):
        f, c = mean("free", which, "ms"), mean("constrained", which, "ms")
        fs, cs = mean("free", which, "sample_ms"), mean("constrained", which, "sample_ms")
        print(f"{label:<8} {f:>12.3f} {c:>15.3f} {100 * (c - f) / f:>6.1f}% {fs:>12.3f} {cs:>15.3f}")


if __name__ == "__main__":
    main()
