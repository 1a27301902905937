#!/usr/bin/python3
"""Interleaved A/B of bench_step (ours) against bench_step_torch.py (PyTorch) for the issue #3
speed target (our step time <= 0.8x PyTorch's, same model, same thread count).

Whole-step times on a shared VM drift by several percent from minute to minute, more than
the differences being measured, so a single pair of runs proves little. This runs N pairs,
alternating which side goes first, and reports every pair's ratio (ours / PyTorch) and the
median ratio. Prints one line per run, then one JSON object.

usage: /usr/bin/python3 apps/bench/compare_step_torch.py [--bench build/rel/apps/bench_step]
       [--config small] [--threads 1] [--pairs 6] [--steps 8] [--warmup 2] [--path fused]

Needs Debian's python3-torch for the PyTorch side (run with /usr/bin/python3).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def last_json(text, what):
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    sys.exit("no JSON line in the output of %s:\n%s" % (what, text))


def run(cmd, env, what):
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.exit("%s failed (exit %d):\n%s" % (what, p.returncode, p.stdout))
    return last_json(p.stdout, what)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", default="build/rel/apps/bench_step", help="bench_step binary")
    ap.add_argument("--config", default="small", choices=["tiny", "small"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--path", default="fused", choices=["fused", "unfused"])
    a = ap.parse_args()
    if not os.access(a.bench, os.X_OK):
        sys.exit("bench_step not found at %s: build it (cmake --preset release && cmake --build "
                 "--preset release) or pass --bench PATH" % a.bench)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    ours_cmd = [a.bench, "--configs", a.config, "--threads", str(a.threads), "--paths", a.path,
                "--steps", str(a.steps), "--warmup", str(a.warmup)]
    torch_cmd = [sys.executable, os.path.join(HERE, "bench_step_torch.py"), "--configs", a.config,
                 "--threads", str(a.threads), "--steps", str(a.steps), "--warmup", str(a.warmup)]
    pairs = []
    for i in range(a.pairs):
        order = ["ours", "torch"] if i % 2 == 0 else ["torch", "ours"]
        got = {}
        for side in order:
            r = run(ours_cmd if side == "ours" else torch_cmd, env, side)
            got[side] = r["results"][0]["median_step_s"]
            print("pair %d %-5s median step %8.1f ms" % (i + 1, side, got[side] * 1e3), flush=True)
        ratio = got["ours"] / got["torch"]
        pairs.append(dict(ours_s=got["ours"], torch_s=got["torch"], ratio=ratio))
        print("pair %d ratio %.3f" % (i + 1, ratio), flush=True)
    ratios = [p["ratio"] for p in pairs]
    med = statistics.median(ratios)
    print("ratios: %s  median %.3f  (target <= 0.80)" % (" ".join("%.3f" % r for r in ratios), med))
    print(json.dumps({"bench": "compare_step_torch", "config": a.config, "threads": a.threads,
                      "path": a.path, "steps": a.steps, "pairs": pairs, "median_ratio": med,
                      "max_ratio": max(ratios), "min_ratio": min(ratios)}))


if __name__ == "__main__":
    main()
