#!/usr/bin/python3
"""Golden data for the engine: the same GPT as engine/model/gpt*.cpp written independently in
PyTorch (autograd, float64), trained 3 steps with AdamW + global-norm clipping.

Writes tests/data/golden/<variant>.json (config, index) + <variant>.bin (little-endian
float32 / int32 arrays): the data of every step, the losses of the 3 steps, the grad norm of
step 1, the logits of step 1 microbatch 0 (sequence-first [s*b, V]) and every parameter's
gradient of step 1 (summed over the microbatches, before clipping).

Initial weights are not stored: both sides compute them with the integer formula of
`init_values` (exact in any language), from the parameter's registration index.

Regenerate (needs Debian's python3-torch):  /usr/bin/python3 tests/golden/make_golden.py [VARIANT...]
"""
import json
import math
import os
import sys

import numpy as np
import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "golden")

BASE = dict(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16, micro_batch_size=2,
            num_microbatches=2, vocab_size=60, make_vocab_size_divisible_by=32, norm_epsilon=1e-5,
            rotary_base=10000.0, lr=3e-3, adam_beta1=0.9, adam_beta2=0.95, adam_eps=1e-8,
            weight_decay=0.1, clip_grad=1.0, steps=3, data_seed=7)

VARIANTS = {
    "gelu_layernorm_untied": dict(swiglu=False, normalization="LayerNorm", num_query_groups=4,
                                  ffn_hidden_size=64, add_bias_linear=True, tied=False),
    "gelu_layernorm_tied": dict(swiglu=False, normalization="LayerNorm", num_query_groups=4,
                                ffn_hidden_size=64, add_bias_linear=True, tied=True),
    "swiglu_rmsnorm_gqa_untied": dict(swiglu=True, normalization="RMSNorm", num_query_groups=2,
                                      ffn_hidden_size=48, add_bias_linear=False, tied=False),
    "swiglu_rmsnorm_gqa_tied": dict(swiglu=True, normalization="RMSNorm", num_query_groups=2,
                                    ffn_hidden_size=48, add_bias_linear=True, tied=True),
    # Megatron's default position embedding: a learned [seq_length, h] table added to the word
    # embedding (no RoPE). The other variants use RoPE (no "position_embedding_type" key).
    "gelu_layernorm_untied_learned_pos": dict(swiglu=False, normalization="LayerNorm", num_query_groups=4,
                                              ffn_hidden_size=64, add_bias_linear=True, tied=False,
                                              position_embedding_type="learned_absolute"),
}


def pos_type(c):
    return c.get("position_embedding_type", "rope")


def init_values(p_index, n, scale, offset):
    """offset + scale * u, u in [-0.5, 0.5) from Knuth's multiplicative hash of (index, i)."""
    i = np.arange(n, dtype=np.uint64)
    x = (i * np.uint64(2654435761) + np.uint64((p_index + 1) * 40503 * 65537 + 12345)) % np.uint64(2**32)
    u = ((x >> np.uint64(8)) & np.uint64(0xFFFFFF)).astype(np.float64) / float(1 << 24) - 0.5
    return offset + scale * u


def init_kind(name):
    if name.endswith("layernorm.weight"):
        return 0.2, 1.0
    if name.endswith(".bias"):
        return 0.1, 0.0
    return 0.2, 0.0


def param_table(c):
    """(name, shape) in the engine's registration order."""
    h, a, g, F = c["hidden_size"], c["num_attention_heads"], c["num_query_groups"], c["ffn_hidden_size"]
    d = h // a
    V = c["padded_vocab"]
    ln = c["normalization"] == "LayerNorm"
    bias = c["add_bias_linear"]
    t = [("embedding.word_embeddings.weight", (V, h))]
    if pos_type(c) == "learned_absolute":  # max_position_embeddings = seq_length
        t.append(("embedding.position_embeddings.weight", (c["seq_length"], h)))
    for l in range(c["num_layers"]):
        p = "decoder.layers.%d." % l
        t.append((p + "input_layernorm.weight", (h,)))
        if ln:
            t.append((p + "input_layernorm.bias", (h,)))
        t.append((p + "self_attention.linear_qkv.weight", ((a + 2 * g) * d, h)))
        if bias:
            t.append((p + "self_attention.linear_qkv.bias", ((a + 2 * g) * d,)))
        t.append((p + "self_attention.linear_proj.weight", (h, a * d)))
        if bias:
            t.append((p + "self_attention.linear_proj.bias", (h,)))
        t.append((p + "pre_mlp_layernorm.weight", (h,)))
        if ln:
            t.append((p + "pre_mlp_layernorm.bias", (h,)))
        f1 = 2 * F if c["swiglu"] else F
        t.append((p + "mlp.linear_fc1.weight", (f1, h)))
        if bias:
            t.append((p + "mlp.linear_fc1.bias", (f1,)))
        t.append((p + "mlp.linear_fc2.weight", (h, F)))
        if bias:
            t.append((p + "mlp.linear_fc2.bias", (h,)))
    t.append(("decoder.final_layernorm.weight", (h,)))
    if ln:
        t.append(("decoder.final_layernorm.bias", (h,)))
    if not c["tied"]:
        t.append(("output_layer.weight", (V, h)))
    return t


def rope(x, theta):
    # x: [s, b, n, d]; rotate-half, angle pos * theta^(-2i/d)
    s, d = x.shape[0], x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = torch.arange(s, dtype=torch.float64)[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    cos, sin = emb.cos()[:, None, None, :], emb.sin()[:, None, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))


def forward(c, P, tokens):
    """tokens: [s, b] -> logits [s, b, V]"""
    h, a, g = c["hidden_size"], c["num_attention_heads"], c["num_query_groups"]
    d, r, s, b = h // a, a // g, tokens.shape[0], tokens.shape[1]
    eps = c["norm_epsilon"]

    def norm(x, prefix):
        w = P[prefix + ".weight"]
        if c["normalization"] == "LayerNorm":
            return torch.nn.functional.layer_norm(x, (h,), w, P[prefix + ".bias"], eps)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def lin(x, name, bias=True):
        y = x @ P[name + ".weight"].t()
        if bias and c["add_bias_linear"]:
            y = y + P[name + ".bias"]
        return y

    x = P["embedding.word_embeddings.weight"][tokens]  # [s, b, h]
    if pos_type(c) == "learned_absolute":
        x = x + P["embedding.position_embeddings.weight"][torch.arange(s)][:, None, :]  # position ids 0..s-1
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)
    for l in range(c["num_layers"]):
        p = "decoder.layers.%d." % l
        y = norm(x, p + "input_layernorm")
        qkv = lin(y, p + "self_attention.linear_qkv").view(s, b, g, r + 2, d)  # per-group [q.., k, v]
        q = qkv[:, :, :, :r, :].reshape(s, b, a, d)
        k = qkv[:, :, :, r, :]
        v = qkv[:, :, :, r + 1, :]
        if pos_type(c) == "rope":
            q, k = rope(q, c["rotary_base"]), rope(k, c["rotary_base"])
        k = k.repeat_interleave(r, dim=2)  # query head j uses group j // r
        v = v.repeat_interleave(r, dim=2)
        sc = torch.einsum("sbnd,tbnd->bnst", q, k) / math.sqrt(d)
        sc = sc.masked_fill(mask, float("-inf"))
        pr = torch.softmax(sc, dim=-1)
        ctx = torch.einsum("bnst,tbnd->sbnd", pr, v).reshape(s, b, a * d)
        x = x + lin(ctx, p + "self_attention.linear_proj")
        y = norm(x, p + "pre_mlp_layernorm")
        f = lin(y, p + "mlp.linear_fc1")
        if c["swiglu"]:
            F = c["ffn_hidden_size"]
            f = torch.nn.functional.silu(f[..., :F]) * f[..., F:]
        else:
            f = gelu_tanh(f)
        x = x + lin(f, p + "mlp.linear_fc2")
    x = norm(x, "decoder.final_layernorm")
    W = P["embedding.word_embeddings.weight"] if c["tied"] else P["output_layer.weight"]
    return x @ W.t()


def run(name, c):
    torch.set_default_dtype(torch.float64)
    V = c["padded_vocab"]
    table = param_table(c)
    P = {}
    for i, (pname, shape) in enumerate(table):
        scale, offset = init_kind(pname)
        P[pname] = torch.tensor(init_values(i, int(np.prod(shape)), scale, offset).reshape(shape),
                                requires_grad=True)
    decay = [P[n] for n, s in table if len(s) == 2]
    no_decay = [P[n] for n, s in table if len(s) == 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": c["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=c["lr"], betas=(c["adam_beta1"], c["adam_beta2"]), eps=c["adam_eps"])
    s, b, m = c["seq_length"], c["micro_batch_size"], c["num_microbatches"]
    rng = np.random.RandomState(c["data_seed"])
    data = rng.randint(0, c["vocab_size"], size=(c["steps"], m, b, s + 1)).astype(np.int32)
    arrays = {"data": data}
    losses, norms = [], []
    for step in range(c["steps"]):
        for p in P.values():
            p.grad = None
        report = 0.0
        for mb in range(m):
            x = torch.tensor(data[step, mb], dtype=torch.long)  # [b, s+1]
            inp, lab = x[:, :-1].t().contiguous(), x[:, 1:].t().contiguous()  # [s, b]
            logits = forward(c, P, inp)
            tok = torch.nn.functional.cross_entropy(logits.reshape(-1, V), lab.reshape(-1), reduction="none")
            loss = tok.sum() / (s * b) / m  # Megatron: / num_tokens / num_microbatches
            loss.backward()
            report += tok.mean().item()
            if step == 0 and mb == 0:
                arrays["logits"] = logits.detach().reshape(-1, V).numpy()
        losses.append(report / m)
        if step == 0:
            for pname, _ in table:
                arrays["grad/" + pname] = P[pname].grad.numpy().copy()
        norms.append(torch.nn.utils.clip_grad_norm_(list(P.values()), c["clip_grad"]).item())
        opt.step()
    index, blob, off = {}, bytearray(), 0
    for key, arr in arrays.items():
        dt = "i32" if arr.dtype == np.int32 else "f32"
        raw = arr.astype(np.int32 if dt == "i32" else np.float32).tobytes()
        index[key] = {"offset": off, "shape": list(arr.shape), "dtype": dt}
        blob += raw
        off += len(raw) // 4
    meta = {"config": c, "losses": losses, "grad_norms": norms, "params": [n for n, _ in table],
            "arrays": index, "torch_version": torch.__version__,
            "note": "generated by tests/golden/make_golden.py (float64 PyTorch reference)"}
    with open(os.path.join(OUT, name + ".json"), "w") as f:
        json.dump(meta, f, indent=1)
    with open(os.path.join(OUT, name + ".bin"), "wb") as f:
        f.write(bytes(blob))
    print("%-28s losses %s grad norms %s (%d KB)" % (name, ["%.6f" % l for l in losses],
                                                   ["%.4f" % n for n in norms], len(blob) // 1024))


def main():
    """Arguments: variant names to (re)generate (default: all)."""
    os.makedirs(OUT, exist_ok=True)
    names = sys.argv[1:] or list(VARIANTS)
    for name in names:
        if name not in VARIANTS:
            print("unknown variant %s (have %s)" % (name, ", ".join(VARIANTS)), file=sys.stderr)
            return 2
        v = VARIANTS[name]
        c = dict(BASE)
        c.update(v)
        mult = c["make_vocab_size_divisible_by"]
        c["padded_vocab"] = (c["vocab_size"] + mult - 1) // mult * mult
        run(name, c)
    return 0


if __name__ == "__main__":
    sys.exit(main())
