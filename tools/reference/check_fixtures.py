#!/usr/bin/env python3
"""Independent numpy (fp32) forward pass of the fixtures, written from the models' math (docs/model-math.md), checked
against the transformers reference outputs stored beside each checkpoint. Needs only numpy.

    python3 tools/reference/check_fixtures.py [tests/data/fixtures] [--only name,...]

It reads HF checkpoints (per-expert or fused experts, single file or shards, tied or not, flat or
VL-prefixed names) and MLX 4/8-bit checkpoints (switch_mlp, 1+w norms, conv [C,K,1]), so it is also
a compact executable description of what the engine has to do.
"""

import json
import math
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixture_lib as fl  # noqa: E402
import st_io  # noqa: E402

EPS = 1e-6


class Weights:
    def __init__(self, d):
        self.t, _ = st_io.load_dir(d)
        self.mlx = any(v.dtype == "U32" for v in self.t.values())
        names = list(self.t)
        if any(n.startswith("language_model.model.") for n in names):
            self.pre, self.head = "language_model.model.", "language_model.lm_head"
        elif any(n.startswith("model.language_model.") for n in names):
            self.pre, self.head = "model.language_model.", "lm_head"
        else:
            self.pre, self.head = "model.", "lm_head"

    def has(self, path):
        return path + ".weight" in self.t or path in self.t

    def raw(self, name):
        return self.t[name]

    def linear(self, path):
        """Weight matrix [out, in] as float32 (dequantised when MLX)."""
        w = self.t[path + ".weight"]
        if w.dtype == "U32":
            s, b = self.t[path + ".scales"], self.t[path + ".biases"]
            bits = 32 * w.data.shape[-1] // (s.data.shape[-1] * fl.GROUP_SIZE)
            return fl.dequantize(w.data, s.data, b.data, bits)
        return w.to_f32()

    def norm1p(self, path):
        """Multiplier of a zero-centred RMSNorm: 1 + w (HF) or the stored value (MLX)."""
        w = self.t[path + ".weight"].to_f32()
        return w if self.mlx else (np.float32(1) + w)

    def experts(self, mlp):
        """(gate [E,I,H], up [E,I,H], down [E,H,I])"""
        if self.has(mlp + ".switch_mlp.gate_proj"):
            return tuple(self.linear(f"{mlp}.switch_mlp.{p}") for p in ("gate_proj", "up_proj", "down_proj"))
        if mlp + ".experts.gate_up_proj" in self.t:
            gu = self.t[mlp + ".experts.gate_up_proj"].to_f32()
            i = gu.shape[1] // 2
            return gu[:, :i], gu[:, i:], self.t[mlp + ".experts.down_proj"].to_f32()
        E = 0
        while f"{mlp}.experts.{E}.gate_proj.weight" in self.t:
            E += 1
        st = lambda p: np.stack([self.t[f"{mlp}.experts.{e}.{p}.weight"].to_f32() for e in range(E)])  # noqa: E731
        return st("gate_proj"), st("up_proj"), st("down_proj")


def rms(x, eps=EPS):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)


def silu(x):
    return x / (1 + np.exp(-x))


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def softplus(x):
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))


def l2n(x):
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)


class Model:
    def __init__(self, d):
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        self.c = c = cfg.get("text_config", cfg)
        self.w = Weights(d)
        L = c["num_hidden_layers"]
        if c.get("layer_types"):
            self.types = c["layer_types"]
        else:
            iv = c.get("full_attention_interval", 4)
            self.types = ["linear_attention" if (i + 1) % iv else "full_attention" for i in range(L)]
        rp = c.get("rope_parameters") or {}
        self.theta = float(rp.get("rope_theta", c.get("rope_theta", 10000.0)))
        self.prf = float(rp.get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0)))
        self.norm_topk = c.get("norm_topk_prob", True)
        self.k = c["num_experts_per_tok"]
        self.router_log = []

    def embed(self, ids):
        return self.w.linear(self.w.pre + "embed_tokens")[ids]

    def attention(self, p, a):
        c, w = self.c, self.w
        T = a.shape[0]
        nh, kv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        P = (a @ w.linear(p + "q_proj").T).reshape(T, nh, 2 * hd)
        q, gate = P[..., :hd], P[..., hd:].reshape(T, nh * hd)
        k = (a @ w.linear(p + "k_proj").T).reshape(T, kv, hd)
        v = (a @ w.linear(p + "v_proj").T).reshape(T, kv, hd)
        q = rms(q) * w.norm1p(p + "q_norm")
        k = rms(k) * w.norm1p(p + "k_norm")
        rd = int(hd * self.prf)
        inv = self.theta ** (-np.arange(0, rd, 2, dtype=np.float64) / rd)
        ang = np.arange(T)[:, None] * inv[None, :]
        cos = np.concatenate([np.cos(ang)] * 2, -1)[:, None, :].astype(np.float32)
        sin = np.concatenate([np.sin(ang)] * 2, -1)[:, None, :].astype(np.float32)

        def rope(x):
            r, rest = x[..., :rd], x[..., rd:]
            half = np.concatenate([-r[..., rd // 2:], r[..., :rd // 2]], -1)
            return np.concatenate([r * cos + half * sin, rest], -1)
        q, k = rope(q), rope(k)
        grp = nh // kv
        o = np.zeros((T, nh, hd), np.float32)
        mask = np.triu(np.full((T, T), -np.inf, np.float32), 1)
        for j in range(nh):
            s = q[:, j] @ k[:, j // grp].T / math.sqrt(hd) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            o[:, j] = (s / s.sum(-1, keepdims=True)) @ v[:, j // grp]
        o = o.reshape(T, nh * hd) * sigmoid(gate)
        return o @ w.linear(p + "o_proj").T

    def gdn(self, p, a):
        c, w = self.c, self.w
        T = a.shape[0]
        kh, vh, dk, dv = (c["linear_num_key_heads"], c["linear_num_value_heads"],
                          c["linear_key_head_dim"], c["linear_value_head_dim"])
        r = vh // kh
        if w.has(p + "in_proj_qkvz"):  # Qwen3-Next: grouped per key head
            P = (a @ w.linear(p + "in_proj_qkvz").T).reshape(T, kh, 2 * dk + 2 * r * dv)
            q, k = P[..., :dk], P[..., dk:2 * dk]
            v = P[..., 2 * dk:2 * dk + r * dv].reshape(T, vh, dv)
            z = P[..., 2 * dk + r * dv:].reshape(T, vh, dv)
            R = (a @ w.linear(p + "in_proj_ba").T).reshape(T, kh, 2 * r)
            b, al = R[..., :r].reshape(T, vh), R[..., r:].reshape(T, vh)
            mixed = np.concatenate([q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1)], -1)
        else:  # Qwen3.5: split projections
            mixed = a @ w.linear(p + "in_proj_qkv").T
            z = (a @ w.linear(p + "in_proj_z").T).reshape(T, vh, dv)
            b = a @ w.linear(p + "in_proj_b").T
            al = a @ w.linear(p + "in_proj_a").T
        cw = w.raw(p + "conv1d.weight").to_f32()
        cw = cw[:, :, 0] if cw.shape[-1] == 1 else cw[:, 0, :]  # MLX [C,K,1] or HF [C,1,K] -> [C,K]
        K = cw.shape[1]
        xp = np.concatenate([np.zeros((K - 1, mixed.shape[1]), np.float32), mixed], 0)
        conv = sum(cw[:, j][None, :] * xp[j:j + T] for j in range(K))
        u = silu(conv)
        kd = kh * dk
        q = l2n(u[:, :kd].reshape(T, kh, dk)) / np.float32(math.sqrt(dk))
        k = l2n(u[:, kd:2 * kd].reshape(T, kh, dk))
        v = u[:, 2 * kd:].reshape(T, vh, dv)
        beta = sigmoid(b)
        g = -np.exp(w.raw(p + "A_log").to_f32()) * softplus(al + w.raw(p + "dt_bias").to_f32())
        S = np.zeros((vh, dk, dv), np.float32)
        o = np.zeros((T, vh, dv), np.float32)
        for t in range(T):
            for h in range(vh):
                kk, qq = k[t, h // r], q[t, h // r]
                S[h] *= np.exp(g[t, h])
                delta = beta[t, h] * (v[t, h] - kk @ S[h])
                S[h] += np.outer(kk, delta)
                o[t, h] = qq @ S[h]
        y = rms(o) * w.raw(p + "norm.weight").to_f32() * silu(z)
        return y.reshape(T, vh * dv) @ w.linear(p + "out_proj").T

    def moe(self, p, x, layer):
        w = self.w
        m = p + "mlp"
        probs = x @ w.linear(m + ".gate").T
        probs = np.exp(probs - probs.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        idx = np.argsort(-probs, -1, kind="stable")[:, :self.k]
        top = np.take_along_axis(probs, idx, -1)
        if self.norm_topk:
            top = top / top.sum(-1, keepdims=True)
        self.router_log.append((layer, idx))
        G, U, D = w.experts(m)
        y = np.zeros_like(x)
        for t in range(x.shape[0]):
            for e, wt in zip(idx[t], top[t]):
                y[t] += wt * (D[e] @ (silu(G[e] @ x[t]) * (U[e] @ x[t])))
        s = (silu(x @ w.linear(m + ".shared_expert.gate_proj").T) * (x @ w.linear(m + ".shared_expert.up_proj").T)) \
            @ w.linear(m + ".shared_expert.down_proj").T
        sg = sigmoid(x @ w.linear(m + ".shared_expert_gate").T)
        return y + sg * s

    def forward(self, ids):
        w = self.w
        self.router_log = []
        h = self.embed(np.array(ids))
        hs = [h]
        for i, kind in enumerate(self.types):
            p = f"{w.pre}layers.{i}."
            a = rms(h) * w.norm1p(p + "input_layernorm")
            h = h + (self.attention(p + "self_attn.", a) if kind == "full_attention" else self.gdn(p + "linear_attn.", a))
            b = rms(h) * w.norm1p(p + "post_attention_layernorm")
            h = h + self.moe(p, b, i)
            hs.append(h)
        last_raw = h
        hn = rms(h) * w.norm1p(w.pre + "norm")
        hs[-1] = hn
        head = w.head if w.has(w.head) else w.pre + "embed_tokens"
        return hn @ w.linear(head).T, np.stack(hs), last_raw


def check(d):
    ref = json.load(open(os.path.join(d, "reference.json")))
    T, V, H, L = len(ref["tokens"]), ref["vocab_size"], ref["hidden_size"], ref["num_layers"]
    m = Model(d)
    logits, hs, last_raw = m.forward(ref["tokens"])
    rl = np.fromfile(os.path.join(d, ref["prefill_logits"]), "<f4").reshape(T, V)
    dl = np.fromfile(os.path.join(d, ref["decode_logits"]), "<f4").reshape(T, V)
    rh = np.fromfile(os.path.join(d, ref["hidden_states"]), "<f4").reshape(L + 1, T, H)
    rr = np.fromfile(os.path.join(d, ref["last_layer_output"]), "<f4").reshape(T, H)
    router = json.load(open(os.path.join(d, "router_topk.json")))
    same_routes = all(np.array_equal(np.array(lay["experts"]), idx)
                      for lay, (_, idx) in zip(router["layers"], m.router_log))
    seq, new = list(ref["tokens"]), []
    for _ in range(len(ref["greedy_new"])):
        lg, _, _ = m.forward(seq)
        new.append(int(np.argmax(lg[-1])))
        seq.append(new[-1])
    res = {
        "prefill": float(np.abs(logits - rl).max()),
        "decode_ref": float(np.abs(logits - dl).max()),
        "hidden": float(np.abs(hs - rh).max()),
        "last_raw": float(np.abs(last_raw - rr).max()),
        "routes": same_routes,
        "greedy": new == ref["greedy_new"],
    }
    ok = res["prefill"] < 1e-3 and res["hidden"] < 1e-3 and res["routes"] and res["greedy"]
    return ok, res


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    root = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tests/data/fixtures")
    only = []
    if "--only" in sys.argv:
        only = sys.argv[sys.argv.index("--only") + 1].split(",")
    names = sorted(n for n in os.listdir(root) if os.path.exists(os.path.join(root, n, "reference.json")))
    bad = 0
    for n in names:
        if only and n not in only:
            continue
        ok, res = check(os.path.join(root, n))
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {n}: " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                                                        for k, v in res.items()))
    print(f"{len(names) - bad} passed, {bad} failed")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
