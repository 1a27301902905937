#!/usr/bin/python3
"""PyTorch side of bench_step: the same GPT training step (fp32, tied embedding, GeLU 4h,
pre-LayerNorm, RoPE, AdamW, grad clipping 1.0, micro-batch 8, random tokens) for the tiny and
small configs, with torch.set_num_threads(1) and (2). Prints median step time, tokens/s and
achieved GFLOP/s (same Megatron FLOPs formula as the C++ bench), then one JSON line.

usage: /usr/bin/python3 apps/bench/bench_step_torch.py [--steps N] [--warmup N]
       [--threads 1,2] [--configs tiny,small]

For a true 1-thread comparison run it with OMP_NUM_THREADS=1 (and --threads 1): torch 1.13's
OpenMP pool otherwise keeps a second core busy after set_num_threads(1) (CPU time ~2x wall).
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn.functional as F

CONFIGS = {
    "tiny": dict(vocab=4096, seq=128, hidden=256, heads=4, layers=4),
    "small": dict(vocab=8192, seq=256, hidden=512, heads=8, layers=6),
}


def megatron_flops(c, batch):
    h, L, s, V = c["hidden"], c["layers"], c["seq"], c["vocab"]
    q = h  # kv_channels * heads, no GQA
    per_token = 6 * h * (4 * h) * 2 * L + 6 * (h * (q + 2 * q) + q * h) * L + 6 * h * V
    return batch * s * per_token + batch * s * s * 6 * q * L


def rope_tables(s, d, theta=10000.0):
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = torch.arange(s, dtype=torch.float32)[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    return emb.cos()[:, None, None, :], emb.sin()[:, None, None, :]


def apply_rope(x, cos, sin):
    d = x.shape[-1]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Block(torch.nn.Module):
    def __init__(self, h, a):
        super().__init__()
        self.a = a
        self.ln1 = torch.nn.LayerNorm(h)
        self.qkv = torch.nn.Linear(h, 3 * h)
        self.proj = torch.nn.Linear(h, h)
        self.ln2 = torch.nn.LayerNorm(h)
        self.fc1 = torch.nn.Linear(h, 4 * h)
        self.fc2 = torch.nn.Linear(4 * h, h)

    def forward(self, x, cos, sin, mask):  # x: [s, b, h]
        s, b, h = x.shape
        a, d = self.a, h // self.a
        qkv = self.qkv(self.ln1(x)).view(s, b, a, 3, d)
        q, k, v = apply_rope(qkv[:, :, :, 0], cos, sin), apply_rope(qkv[:, :, :, 1], cos, sin), qkv[:, :, :, 2]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))  # [b, a, s, d]
        sc = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(d))
        p = torch.softmax(sc.masked_fill(mask, float("-inf")), dim=-1)
        ctx = (p @ v).permute(2, 0, 1, 3).reshape(s, b, h)
        x = x + self.proj(ctx)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class Gpt(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.emb = torch.nn.Embedding(c["vocab"], c["hidden"])
        self.blocks = torch.nn.ModuleList([Block(c["hidden"], c["heads"]) for _ in range(c["layers"])])
        self.lnf = torch.nn.LayerNorm(c["hidden"])
        for p in self.parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, 0.0, 0.02)
        s, d = c["seq"], c["hidden"] // c["heads"]
        self.cos, self.sin = rope_tables(s, d)
        self.mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)

    def forward(self, tokens):  # [s, b]
        x = self.emb(tokens)
        for blk in self.blocks:
            x = blk(x, self.cos, self.sin, self.mask)
        return self.lnf(x) @ self.emb.weight.t()  # tied output layer


def bench(name, threads, steps, warmup):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    c = CONFIGS[name]
    b = 8
    model = Gpt(c)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() == 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8)
    times, cpu = [], []
    for i in range(warmup + steps):
        data = torch.randint(0, c["vocab"], (c["seq"] + 1, b))
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        logits = model(data[:-1])
        loss = F.cross_entropy(logits.reshape(-1, c["vocab"]), data[1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        if i >= warmup:
            times.append(dt)
            cpu.append(dc)
    med = statistics.median(times)
    tokens = b * c["seq"]
    fl = megatron_flops(c, b)
    return dict(config=name, threads=threads, median_step_s=med, min_step_s=min(times),
                median_cpu_s=statistics.median(cpu), tokens_per_s=tokens / med,
                model_flops_per_step=fl, gflops=fl / med / 1e9, torch_version=torch.__version__)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--configs", default="tiny,small")
    args = ap.parse_args()
    results = []
    print("%-6s %-3s %12s %12s %12s %12s" % ("config", "thr", "median_ms", "cpu_ms", "tokens/s", "GFLOP/s"))
    for t in [int(x) for x in args.threads.split(",")]:
        for name in args.configs.split(","):
            r = bench(name, t, args.steps, args.warmup)
            results.append(r)
            print("%-6s %-3d %12.2f %12.2f %12.0f %12.2f" % (name, t, r["median_step_s"] * 1e3, r["median_cpu_s"] * 1e3,
                                                          r["tokens_per_s"], r["gflops"]), flush=True)
    print(json.dumps({"bench": "bench_step_torch", "steps": args.steps, "results": results}))


if __name__ == "__main__":
    main()
