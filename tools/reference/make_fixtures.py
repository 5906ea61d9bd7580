#!/usr/bin/env python3
"""Generate swiftlet's reference fixtures: tiny random-weight Qwen3-Next / Qwen3.5-MoE checkpoints
and transformers' fp32 reference outputs for them.

Usage (needs torch + transformers 5.x; CPU is enough):
    cd tools/reference && python3 make_fixtures.py --out /tmp/fx [--only next_8l,q35_vl]
then copy /tmp/fx/* to tests/data/fixtures/.

Every HF fixture is saved in bf16 with save_pretrained, then RE-LOADED with dtype=float32 and
eager attention; all reference outputs come from that fp32 model, so the weights are exactly the
bf16 values in the files. MLX fixtures are quantised here (fixture_lib.py) and the reference is
computed by transformers on exactly the dequantised weights.
"""

import argparse
import inspect
import json
import math
import os
import re
import shutil
import sys
import time
import traceback

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # CPU reference, fp32

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixture_lib as fl  # noqa: E402
import st_io  # noqa: E402

T_PROMPT = 12
N_NEW = 8
MIN_GREEDY_GAP = 1e-3
MIN_ROUTER_GAP = 1e-4
MAX_TRIES = 8
FAILURES = []


def log(*a):
    print(*a, flush=True)


# ============================================================================ configs

def next_config(*, L, H, heads, kv, hd, kh, vh, dk, dv, E, k, I, Is, V, tied, theta, interval=4):
    from transformers import Qwen3NextConfig
    return Qwen3NextConfig(
        vocab_size=V, hidden_size=H, intermediate_size=2 * I, num_hidden_layers=L,
        num_attention_heads=heads, num_key_value_heads=kv, head_dim=hd,
        linear_num_key_heads=kh, linear_num_value_heads=vh,
        linear_key_head_dim=dk, linear_value_head_dim=dv, linear_conv_kernel_dim=4,
        num_experts=E, num_experts_per_tok=k, moe_intermediate_size=I,
        shared_expert_intermediate_size=Is, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], full_attention_interval=interval, tie_word_embeddings=tied,
        rope_parameters={"rope_type": "default", "rope_theta": float(theta), "partial_rotary_factor": 0.25},
        max_position_embeddings=4096, rms_norm_eps=1e-6, hidden_act="silu", attention_bias=False,
    )


def q35_text_dict(*, L, H, heads, kv, hd, kh, vh, dk, dv, E, k, I, Is, V, tied, theta, layer_types,
                  mrope_section):
    assert len(layer_types) == L
    assert sum(mrope_section) * 2 == int(hd * 0.25), "mrope_section must cover rotary_dim/2 frequencies"
    return dict(
        vocab_size=V, hidden_size=H, num_hidden_layers=L,
        num_attention_heads=heads, num_key_value_heads=kv, head_dim=hd,
        linear_num_key_heads=kh, linear_num_value_heads=vh,
        linear_key_head_dim=dk, linear_value_head_dim=dv, linear_conv_kernel_dim=4,
        num_experts=E, num_experts_per_tok=k, moe_intermediate_size=I,
        shared_expert_intermediate_size=Is, layer_types=list(layer_types), tie_word_embeddings=tied,
        rope_parameters={"rope_type": "default", "rope_theta": float(theta), "partial_rotary_factor": 0.25,
                         "mrope_interleaved": True, "mrope_section": list(mrope_section)},
        max_position_embeddings=4096, rms_norm_eps=1e-6, hidden_act="silu", attention_bias=False,
    )


def q35_vl_config(text):
    from transformers import Qwen3_5MoeConfig
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, in_channels=3,
                  patch_size=4, temporal_patch_size=2, spatial_merge_size=2,
                  out_hidden_size=text["hidden_size"], num_position_embeddings=16)
    return Qwen3_5MoeConfig(text_config=text, vision_config=vision, tie_word_embeddings=False)


def q35_text_config(text):
    from transformers import Qwen3_5MoeTextConfig
    return Qwen3_5MoeTextConfig(**text)


LIN3_FULL = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]

FIXTURES = {
    "next_8l": dict(
        kind="hf", cls="Qwen3NextForCausalLM", seed=1000,
        config=lambda: next_config(L=8, H=64, heads=4, kv=2, hd=32, kh=2, vh=4, dk=16, dv=24, E=8, k=2,
                                   I=32, Is=48, V=320, tied=False, theta=1e7),
        covers="qwen3_next flat config, 8 layers (full attention at 3 and 7), GQA 2:1, head_dim 32 with "
               "partial rotary 0.25 (rotary dim 8), linear value heads 4 > key heads 2, key/value head "
               "dims 16/24 (different), 8 experts top-2 + shared expert (48), untied lm_head, single file.",
    ),
    "q35_vl": dict(
        kind="hf", cls="Qwen3_5MoeForConditionalGeneration", seed=2000, force_layout="fused",
        config=lambda: q35_vl_config(q35_text_dict(
            L=4, H=64, heads=4, kv=2, hd=64, kh=2, vh=4, dk=16, dv=32, E=8, k=2, I=16, Is=24, V=384,
            tied=False, theta=1e7, layer_types=LIN3_FULL, mrope_section=[3, 3, 2])),
        covers="qwen3_5_moe multimodal wrapper (nested text_config, tiny vision tower saved under "
               "model.visual.* which the engine must skip), explicit layer_types, rope in "
               "rope_parameters with mrope_interleaved/mrope_section [3,3,2] (rotary dim 16 of head_dim 64), "
               "split in_proj_qkv/z/b/a, 8 experts top-2 (I 16, shared 24), untied, text-only input; experts rewritten "
               "to the fused layout of the released Qwen3.5 checkpoints (transformers 5.17 saves per-expert).",
    ),
    "next_tied_sharded": dict(
        kind="hf", cls="Qwen3NextForCausalLM", seed=3000, shards=3, secondary_of="next_8l",
        legacy_config=True,
        config=lambda: next_config(L=4, H=48, heads=6, kv=2, hd=16, kh=3, vh=6, dk=16, dv=16, E=8, k=2,
                                   I=24, Is=32, V=400, tied=True, theta=1e4),
        covers="qwen3_next with tied embeddings (no lm_head.weight in the files), GQA 3:1 (6 heads / 2 kv), "
               "head_dim 16 (rotary dim 4), 3 linear key heads / 6 value heads, rope_theta 1e4, "
               "3 shards + model.safetensors.index.json, release-style config.json "
               "(full_attention_interval, top-level rope_theta/partial_rotary_factor, no layer_types), "
               "expert layout rewritten to the other form than next_8l.",
    ),
    "q35_text_tied": dict(
        kind="hf", cls="Qwen3_5MoeForCausalLM", seed=4000, secondary_of="q35_vl",
        config=lambda: q35_text_config(q35_text_dict(
            L=4, H=64, heads=4, kv=1, hd=32, kh=2, vh=6, dk=16, dv=16, E=8, k=2, I=16, Is=16, V=352,
            tied=True, theta=1e5,
            layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
            mrope_section=[2, 1, 1])),
        covers="text-only Qwen3.5 MoE causal LM class (flat text config), tied embeddings, layer_types "
               "alternating linear/full, MQA (4 heads / 1 kv), 2 linear key heads / 6 value heads (ratio 3), "
               "rope_theta 1e5, expert layout rewritten to the other form than q35_vl.",
    ),
    "next_mlx4": dict(
        kind="mlx", cls="Qwen3NextForCausalLM", seed=5000, vl=False,
        config=lambda: next_config(L=4, H=128, heads=4, kv=2, hd=32, kh=2, vh=4, dk=32, dv=32, E=16, k=4,
                                   I=64, Is=64, V=512, tied=False, theta=1e7),
        covers="MLX affine 4-bit (group 64) conversion of a qwen3_next model as mlx-lm writes it: "
               "switch_mlp stacked experts, 8-bit router and shared_expert_gate, quantised embedding and "
               "lm_head, conv1d [C,K,1], norms stored as 1+w; 16 experts top-4.",
    ),
    "q35_mlx4": dict(
        kind="mlx", cls="Qwen3_5MoeForConditionalGeneration", seed=6000, vl=True,
        config=lambda: q35_vl_config(q35_text_dict(
            L=4, H=128, heads=4, kv=2, hd=32, kh=2, vh=4, dk=32, dv=32, E=16, k=4, I=64, Is=64, V=512,
            tied=False, theta=1e7, layer_types=LIN3_FULL, mrope_section=[2, 1, 1])),
        covers="MLX affine 4-bit conversion of a Qwen3.5 MoE (VL wrapper) model as mlx-lm writes it: "
               "names language_model.model.* / language_model.lm_head, vision dropped, experts stacked "
               "into switch_mlp gate/up/down, 8-bit router and shared_expert_gate, 16 experts top-4.",
    ),
}
ORDER = ["next_8l", "q35_vl", "next_tied_sharded", "q35_text_tied", "next_mlx4", "q35_mlx4"]


# ============================================================================ model helpers

def model_class(name):
    return getattr(transformers, name)


def randomize(model, seed, emb_std, lm_head_gain):
    """Overwrite every parameter (nothing left at 0 or 1)."""
    g = torch.Generator().manual_seed(seed)
    counts = {}

    def normal(shape, std, mean=0.0):
        return torch.randn(shape, generator=g, dtype=torch.float32) * std + mean

    with torch.no_grad():
        for name, p in model.named_parameters():
            shp = tuple(p.shape)
            if "visual" in name:
                rule = "visual"
                v = normal(shp, 0.05, 1.0 if (len(shp) == 1 and "norm" in name and name.endswith("weight")) else 0.0)
            elif name.endswith("A_log"):
                rule = "A_log"
                v = torch.log(torch.rand(shp, generator=g) * 15.0 + 1.0)
            elif name.endswith("dt_bias"):
                rule = "dt_bias"
                v = normal(shp, 0.5)
            elif name.endswith("conv1d.weight"):
                rule = "conv1d"
                v = normal(shp, 0.3)
            elif name.endswith("linear_attn.norm.weight"):
                rule = "gated_norm"
                v = normal(shp, 0.2, 1.0)
            elif len(shp) == 1 and name.endswith("norm.weight"):
                rule = "zero_centred_norm"
                v = normal(shp, 0.2)
            elif name.endswith("embed_tokens.weight"):
                rule = "embedding"
                v = normal(shp, emb_std)
            elif re.search(r"experts\.(gate_up_proj|down_proj)$", name):
                rule = "experts"
                v = normal(shp, 1.0 / math.sqrt(shp[-1]))
            elif len(shp) == 2:
                rule = "linear"
                gain = lm_head_gain if name.endswith("lm_head.weight") else 1.0
                v = normal(shp, gain / math.sqrt(shp[1]))
            else:
                rule = "other"
                log(f"  [warn] unexpected parameter {name} {shp}: N(0, 0.2)")
                v = normal(shp, 0.2)
            counts[rule] = counts.get(rule, 0) + 1
            p.copy_(v.to(p.dtype))
    return counts


def set_eager_experts(model):
    seen = set()
    for mod in model.modules():
        cfg = getattr(mod, "config", None)
        if cfg is None or id(cfg) in seen:
            continue
        seen.add(id(cfg))
        try:
            cfg._experts_implementation = "eager"
        except Exception as e:  # noqa: BLE001
            log(f"  [warn] could not set eager experts on {type(cfg).__name__}: {e}")
    impls = set()
    for mod in model.modules():
        if type(mod).__name__.endswith("Experts") and hasattr(mod, "config"):
            impls.add(str(getattr(mod.config, "_experts_implementation", "?")))
    return impls


def load_fp32(cls, d):
    kw = dict(dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    try:
        model, info = cls.from_pretrained(d, experts_implementation="eager", **kw)
    except Exception as e:  # noqa: BLE001
        log(f"  (from_pretrained without experts_implementation: {type(e).__name__}: {str(e)[:200]})")
        model, info = cls.from_pretrained(d, **kw)
    model.eval()
    impls = set_eager_experts(model)
    info = {k: sorted(v) if isinstance(v, (set, list)) else v for k, v in (info or {}).items()}
    return model, info, impls


def loading_problems(info):
    probs = {}
    for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        v = info.get(k)
        if v:
            probs[k] = [str(x) for x in v][:12]
    return probs


def make_tokens(V, seed):
    rng = np.random.default_rng(seed)
    b = [int(x) for x in rng.choice(np.arange(1, V - 1), size=9, replace=False)]
    toks = [b[0], b[1], b[2], 0, b[1], b[3], b[4], V - 1, b[5], b[6], b[1], b[7]]
    assert len(toks) == T_PROMPT
    return toks


class RouterRecorder:
    """Forward hooks on every router (`*.mlp.gate`): chosen experts, their weights, and the
    smallest gap between the k-th and (k+1)-th softmax probability."""

    def __init__(self, model):
        self.active = False
        self.records = {}
        self.handles = []
        for name, mod in model.named_modules():
            w = getattr(mod, "weight", None)
            if name.endswith("mlp.gate") and isinstance(w, torch.Tensor) and w.ndim == 2 and w.shape[0] > 1:
                self.handles.append(mod.register_forward_hook(self._hook(name)))

    def _hook(self, name):
        def hook(mod, args, out):
            if not self.active:
                return
            x = args[0].reshape(-1, mod.weight.shape[1]).float()
            probs = torch.softmax(x @ mod.weight.float().t(), dim=-1)
            if isinstance(out, tuple) and len(out) >= 3:
                weights, idx = out[1], out[2]
            else:
                raise RuntimeError(f"router {name} returned {type(out)}")
            k = idx.shape[-1]
            srt = probs.sort(dim=-1, descending=True).values
            gap = float((srt[:, k - 1] - srt[:, k]).min()) if srt.shape[1] > k else 1.0
            same = bool((probs.topk(k, dim=-1).indices == idx).all())
            self.records[name] = {"experts": idx.tolist(), "weights": [[round(float(v), 6) for v in r] for r in weights],
                                  "min_prob_gap": gap, "matches_recomputed_topk": same}
        return hook

    def layers(self):
        out = []
        for name, r in self.records.items():
            m = re.search(r"layers\.(\d+)\.", name)
            out.append((int(m.group(1)) if m else -1, name, r))
        return sorted(out)


def decoder_layers(model):
    layers = []
    for name, mod in model.named_modules():
        m = re.search(r"(^|\.)layers\.(\d+)$", name)
        if m and "visual" not in name:
            layers.append((int(m.group(2)), name, mod))
    return sorted(layers)


def final_norm(model):
    for name, mod in model.named_modules():
        if (name.endswith("model.norm") or name.endswith("language_model.norm")) and "visual" not in name:
            return name, mod
    return None, None


@torch.no_grad()
def run_prefill(model, tokens, rec):
    last = {}
    layers = decoder_layers(model)
    h = layers[-1][2].register_forward_hook(lambda m, a, o: last.__setitem__("out", o[0] if isinstance(o, tuple) else o))
    rec.active = True
    try:
        out = model(input_ids=torch.tensor([tokens]), use_cache=False, output_hidden_states=True)
    finally:
        rec.active = False
        h.remove()
    logits = out.logits[0].float()
    hs = torch.stack([x[0].float() for x in out.hidden_states])
    return logits, hs, last["out"][0].float()


@torch.no_grad()
def run_decode(model, tokens):
    cache = None
    rows = []
    for t in tokens:
        out = model(input_ids=torch.tensor([[t]]), past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        rows.append(out.logits[0, -1].float())
    return torch.stack(rows), type(cache).__name__


@torch.no_grad()
def run_greedy(model, tokens, n):
    seq = list(tokens)
    new, gaps = [], []
    for _ in range(n):
        out = model(input_ids=torch.tensor([seq]), use_cache=False)
        top = torch.topk(out.logits[0, -1].float(), 2)
        gaps.append(float(top.values[0] - top.values[1]))
        new.append(int(top.indices[0]))
        seq.append(new[-1])
    return new, gaps


def dump_json(obj):
    """json with one key per line but number lists kept on one line."""
    txt = json.dumps(obj, indent=1)
    return re.sub(r"\[\s+([-0-9.,\se+]+?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", txt)


def write_f32(path, t):
    np.ascontiguousarray(t.detach().cpu().numpy().astype("<f4")).tofile(path)


def text_cfg(cfg_json):
    return cfg_json.get("text_config", cfg_json)


# ============================================================================ fixture builders

def build_checkpoint(spec, seed, d):
    """Instantiate, randomise, save in bf16. Returns (bf16 state as fp32 tensors, config json, counts)."""
    cls = model_class(spec["cls"])
    config = spec["config"]()
    torch.manual_seed(seed)
    model = cls(config)
    model.eval()
    tcfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    tied = bool(getattr(tcfg, "tie_word_embeddings", False) or getattr(config, "tie_word_embeddings", False))
    H = tcfg.hidden_size
    counts = randomize(model, seed, emb_std=(2.0 / math.sqrt(H)) if tied else 1.0, lm_head_gain=2.0)
    model.to(torch.bfloat16)
    bf16_state = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    if os.path.exists(d):
        shutil.rmtree(d)
    kw = {}
    if spec.get("shards"):
        total = sum(p.numel() * 2 for p in model.parameters())
        kw["max_shard_size"] = int(total // spec["shards"]) + 1
    model.save_pretrained(d, **kw)
    with open(os.path.join(d, "config.json")) as f:
        cfg_json = json.load(f)
    del model
    return bf16_state, cfg_json, counts, tied


def evaluate(model, tokens, quick=False):
    rec = RouterRecorder(model)
    logits, hs, last_raw = run_prefill(model, tokens, rec)
    routers = rec.layers()
    for h in rec.handles:
        h.remove()
    new, gaps = run_greedy(model, tokens, N_NEW)
    router_gap = min((r["min_prob_gap"] for _, _, r in routers), default=1.0)
    return dict(logits=logits, hs=hs, last_raw=last_raw, routers=routers, new=new, gaps=gaps,
                router_gap=router_gap)


@torch.no_grad()
def hidden_semantics(model, ev):
    hs, raw = ev["hs"], ev["last_raw"]
    _, norm = final_norm(model)
    d_raw = float((hs[-1] - raw).abs().max())
    d_norm = float((hs[-1] - norm(raw.unsqueeze(0))[0].float()).abs().max()) if norm is not None else float("nan")
    if d_norm < 1e-5:
        return "normed", d_raw, d_norm
    if d_raw < 1e-5:
        return "raw", d_raw, d_norm
    return "unknown", d_raw, d_norm


def compare_weights(model, bf16_state, transform=None):
    worst, missing = 0.0, []
    for n, p in model.named_parameters():
        ref = bf16_state.get(n)
        if ref is None:
            missing.append(n)
            continue
        if transform is not None:
            ref = transform(n, ref)
        worst = max(worst, float((p.detach().float() - ref).abs().max()))
    return worst, missing


def tensor_listing(d):
    tensors, info = st_io.load_dir(d)
    rows = [(n, t.dtype, t.shape) for n, t in sorted(tensors.items())]
    return rows, info, tensors


def summarize_tensors(rows, max_plain=14):
    plain = [r for r in rows if ".experts." not in r[0] and "switch_mlp" not in r[0] and "visual" not in r[0]]
    expert = [r for r in rows if (".experts." in r[0] or "switch_mlp" in r[0]) and re.search(r"layers\.0\.", r[0])]
    expert = [r for r in expert if not re.search(r"experts\.([2-9]|\d\d+)\.", r[0])]
    visual = [r for r in rows if "visual" in r[0]]
    dtypes = {}
    for _, dt, _ in rows:
        dtypes[dt] = dtypes.get(dt, 0) + 1
    return {"count": len(rows), "dtypes": dtypes, "first": plain[:max_plain],
            "layer0_experts": expert[:9], "visual_count": len(visual), "visual_first": visual[:3]}


def dir_size(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))


def write_reference(out_dir, name, spec, cfg_json, tokens, ev, dec, dec_cache, sem, extra_notes, extra=None):
    tc = text_cfg(cfg_json)
    V = int(ev["logits"].shape[1])
    H = int(tc["hidden_size"])
    L = int(tc["num_hidden_layers"])
    assert ev["hs"].shape == (L + 1, len(tokens), H), ev["hs"].shape
    write_f32(os.path.join(out_dir, "prefill_logits.f32"), ev["logits"])
    write_f32(os.path.join(out_dir, "decode_logits.f32"), dec)
    write_f32(os.path.join(out_dir, "hidden_states.f32"), ev["hs"])
    write_f32(os.path.join(out_dir, "last_layer_output.f32"), ev["last_raw"])
    diff = float((ev["logits"] - dec).abs().max())
    notes = [
        f"transformers {transformers.__version__}, torch {torch.__version__}, CPU fp32, attn_implementation=eager, "
        f"experts eager; weights are the bf16 values of the files.",
        "prefill_logits: one full-sequence forward (use_cache=False). decode_logits: tokens fed one at a "
        f"time with past_key_values ({dec_cache}).",
        f"hidden_states: (L+1) x T x H from output_hidden_states=True; entry 0 = embeddings, entry i "
        f"(1..L-1) = output of layer i-1, entry L = {'output of the last layer AFTER the final norm' if sem[0] == 'normed' else sem[0]} "
        f"(transformers replaces the last entry by last_hidden_state). last_layer_output.f32 (T x H) holds "
        f"the last layer's raw output before the final norm.",
        "greedy_new: argmax of repeated full-sequence forwards (no cache) starting from greedy_prompt.",
    ] + extra_notes
    ref = {
        "family": cfg_json.get("model_type"),
        "architectures": cfg_json.get("architectures"),
        "tokens": tokens,
        "vocab_size": V,
        "hidden_size": H,
        "num_layers": L,
        "prefill_logits": "prefill_logits.f32",
        "decode_logits": "decode_logits.f32",
        "hidden_states": "hidden_states.f32",
        "last_layer_output": "last_layer_output.f32",
        "hidden_states_last_is_normed": sem[0] == "normed",
        "greedy_prompt": tokens,
        "greedy_new": ev["new"],
        "greedy_min_top2_gap": min(ev["gaps"]),
        "max_abs_prefill_vs_decode": diff,
        "prefill_logits_std": float(ev["logits"].std()),
        "router_min_prob_gap": ev["router_gap"],
        "notes": " ".join(notes),
    }
    if extra:
        ref.update(extra)
    with open(os.path.join(out_dir, "reference.json"), "w") as f:
        f.write(dump_json(ref) + "\n")
    rt = {"note": "per MoE layer (ascending), per prompt token: chosen experts in torch.topk order and their "
                  "routing weights, from the prefill forward",
          "layers": [{"layer": li, "module": n, "experts": r["experts"], "weights": r["weights"],
                      "min_prob_gap": r["min_prob_gap"]} for li, n, r in ev["routers"]]}
    with open(os.path.join(out_dir, "router_topk.json"), "w") as f:
        json.dump(rt, f)
        f.write("\n")
    return ref


def expert_usage(routers, E):
    use = [0] * E
    for _, _, r in routers:
        for row in r["experts"]:
            for e in row:
                use[e] += 1
    return use


def pick_seed(name, spec, work, quantised=False):
    """Try seeds until greedy top-2 gaps and router gaps are comfortable. Returns state."""
    cls = model_class(spec["cls"])
    best = None
    for attempt in range(MAX_TRIES):
        seed = spec["seed"] + 17 * attempt
        d = os.path.join(work, f"{name}_hf_{seed}")
        bf16_state, cfg_json, counts, tied = build_checkpoint(spec, seed, d)
        model, info, impls = load_fp32(cls, d)
        wdiff, wmissing = compare_weights(model, bf16_state)
        patched = 0
        if quantised:
            patched = patch_to_dequantised(model)
        V = int(text_cfg(cfg_json)["vocab_size"])
        tokens = make_tokens(V, seed)
        ev = evaluate(model, tokens)
        ok = min(ev["gaps"]) > MIN_GREEDY_GAP and ev["router_gap"] > MIN_ROUTER_GAP
        log(f"  seed {seed}: greedy gaps min {min(ev['gaps']):.4g}, router prob gap min {ev['router_gap']:.3g}, "
            f"reload weight diff {wdiff:g}, loading problems {loading_problems(info)}, experts impl {impls}"
            + (f", patched {patched} params to dequantised values" if quantised else "")
            + ("" if ok else "  -> retry"))
        state = dict(seed=seed, d=d, bf16_state=bf16_state, cfg_json=cfg_json, counts=counts, tied=tied,
                     model=model, info=info, impls=impls, wdiff=wdiff, wmissing=wmissing, tokens=tokens,
                     ev=ev, tries=attempt + 1)
        if ok:
            return state
        score = min(min(ev["gaps"]) / MIN_GREEDY_GAP, ev["router_gap"] / MIN_ROUTER_GAP)
        if best is None or score > best[0]:
            best = (score, state)
    log(f"  [warn] no seed passed the gap checks; using the best one ({best[1]['seed']})")
    return best[1]


def patch_to_dequantised(model):
    n = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            arr = p.detach().float().cpu().numpy()
            new = fl.reference_param(name, arr)
            if new is not None:
                p.copy_(torch.from_numpy(np.ascontiguousarray(new)).to(p.dtype))
                n += 1
    return n


def legacy_next_config(cfg):
    """transformers-5 qwen3_next config.json -> the style of the released Qwen3-Next config.json."""
    cfg = dict(cfg)
    lt = cfg.pop("layer_types", None)
    if lt:
        interval = lt.index("full_attention") + 1
        expect = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(len(lt))]
        if expect != lt:
            raise ValueError(f"layer_types {lt} is not an interval pattern")
        cfg["full_attention_interval"] = interval
    rp = cfg.pop("rope_parameters", None) or {}
    cfg["rope_theta"] = rp.get("rope_theta", 10000.0)
    cfg["partial_rotary_factor"] = rp.get("partial_rotary_factor", 0.25)
    cfg["rope_scaling"] = None
    if "dtype" in cfg:
        cfg["torch_dtype"] = cfg.pop("dtype")
    return cfg


@torch.no_grad()
def verify_reload(spec, d, ref_logits, tokens, what):
    try:
        model, info, _ = load_fp32(model_class(spec["cls"]), d)
        logits = model(input_ids=torch.tensor([tokens]), use_cache=False).logits[0].float()
        diff = float((logits - ref_logits).abs().max())
        probs = loading_problems(info)
        ok = diff < 1e-4 and not probs.get("missing_keys")
        log(f"  verify ({what}): transformers reload max|logits - reference| = {diff:.3g}; loading problems: "
            f"{probs or 'none'} -> {'OK' if ok else 'NOT equivalent'}")
        return ok, diff, probs
    except Exception as e:  # noqa: BLE001
        log(f"  verify ({what}): transformers could not load it: {type(e).__name__}: {str(e)[:300]}")
        return False, None, {"exception": f"{type(e).__name__}: {str(e)[:300]}"}


def make_hf(name, spec, out_root, work, results):
    st = pick_seed(name, spec, work)
    model, ev, tokens = st["model"], st["ev"], st["tokens"]
    dec, dec_cache = run_decode(model, tokens)
    sem = hidden_semantics(model, ev)
    out_dir = os.path.join(out_root, name)
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    shutil.copytree(st["d"], out_dir)
    notes, extra = [], {}
    saved_rows, saved_info, saved_tensors = tensor_listing(out_dir)
    saved_layout = fl.expert_layout(saved_tensors)
    extra["expert_layout_as_saved_by_transformers"] = saved_layout
    layout = saved_layout
    prim = spec.get("secondary_of")
    if spec.get("legacy_config"):
        with open(os.path.join(out_dir, "config.json")) as f:
            cfg = json.load(f)
        legacy = legacy_next_config(cfg)
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(legacy, f, indent=2)
            f.write("\n")
        ok, diff, probs = verify_reload(spec, out_dir, ev["logits"], tokens, "release-style config.json")
        if ok:
            notes.append("config.json rewritten to the released Qwen3-Next style (full_attention_interval, "
                         "top-level rope_theta / partial_rotary_factor / rope_scaling null, torch_dtype; no "
                         f"layer_types / rope_parameters); transformers reloads it to the same logits ({diff:.2g}).")
            extra["config_style"] = "release (legacy keys)"
        else:
            with open(os.path.join(out_dir, "config.json"), "w") as f:
                json.dump(cfg, f, indent=2)
                f.write("\n")
            notes.append("release-style config.json did not reload equivalently; kept transformers' config.")
            extra["config_style"] = "transformers 5"
    target = spec.get("force_layout")
    if prim:
        prim_layout = results.get(prim, {}).get("layout")
        if prim_layout is None:
            log(f"  [warn] primary {prim} missing; assuming it is per_expert")
            prim_layout = "per_expert"
        target = "fused" if prim_layout == "per_expert" else "per_expert"
    if target and target != saved_layout:
        tensors, info = st_io.load_dir(out_dir)
        new = fl.to_fused(tensors) if target == "fused" else fl.to_per_expert(tensors)
        n_shards = len(info["shards"])
        st_io.save_dir(new, out_dir, n_shards=n_shards, metadata=info["file_metadata"] or {"format": "pt"})
        layout = target
        ok, diff, probs = verify_reload(spec, out_dir, ev["logits"], tokens, f"expert layout {target}")
        extra["rewritten_layout_reloads_in_transformers"] = bool(ok)
        if not ok:
            FAILURES.append(f"{name}: rewritten {target} layout does not reload equivalently ({probs})")
        notes.append(f"Expert tensors rewritten from transformers' {saved_layout} layout to {target} after the "
                     f"reference was computed (values unchanged); transformers "
                     f"{'reloads it to the same logits' if ok else 'does NOT reload this layout equivalently'} "
                     f"({probs or 'no loading problems'}).")
    extra["expert_layout"] = layout
    extra["tied_embeddings"] = st["tied"]
    ref = write_reference(out_dir, name, spec, json.load(open(os.path.join(out_dir, "config.json"))), tokens, ev,
                          dec, dec_cache, sem, notes, extra)
    rows, info, tensors = tensor_listing(out_dir)
    results[name] = dict(layout=layout, spec=spec, state=st, ref=ref, rows=rows, shards=info["shards"],
                         sem=sem, size=dir_size(out_dir), cfg=json.load(open(os.path.join(out_dir, "config.json"))))
    finish_log(name, results[name])


def make_mlx(name, spec, out_root, work, results):
    st = pick_seed(name, spec, work, quantised=True)
    model, ev, tokens = st["model"], st["ev"], st["tokens"]
    dec, dec_cache = run_decode(model, tokens)
    sem = hidden_semantics(model, ev)
    hf_tensors, _ = st_io.load_dir(st["d"])
    saved_layout = fl.expert_layout(hf_tensors)
    mlx, overrides, clog = fl.hf_to_mlx(hf_tensors, vl_prefix=spec["vl"])
    for line in clog:
        log("  " + line)
    # cross-check: dequantised MLX tensors == the patched reference parameters
    view = fl.mlx_to_hf_view(mlx, vl_prefix=spec["vl"])
    worst, missing, checked = 0.0, [], 0
    for n, p in model.named_parameters():
        if "visual" in n:
            continue
        if n not in view:
            missing.append(n)
            continue
        a = p.detach().float().numpy()
        b = view[n]
        if fl.is_zero_centred_norm(n):
            a, b = a + np.float32(1), b + np.float32(1)
        worst = max(worst, float(np.abs(a - b).max()))
        checked += 1
    log(f"  MLX cross-check: {checked} params, max |dequant(MLX) - reference param| = {worst:g}, "
        f"reference params without MLX tensor: {missing[:5]}")
    if worst != 0.0 or missing:
        FAILURES.append(f"{name}: MLX cross-check mismatch {worst} / {missing[:5]}")
    out_dir = os.path.join(out_root, name)
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)
    st_io.save_dir(mlx, out_dir, n_shards=1, metadata={"format": "mlx"}, always_index=True)
    cfg = dict(st["cfg_json"])
    q = {"group_size": fl.GROUP_SIZE, "bits": 4, "mode": "affine"}

    def layer_key(p):
        m = re.search(r"layers\.(\d+)\.", p)
        return (int(m.group(1)) if m else -1, p)
    for p in sorted(overrides, key=layer_key):
        q[p] = overrides[p]
    cfg["quantization"] = q
    cfg["quantization_config"] = json.loads(json.dumps(q))
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    notes = [
        "MLX 4-bit fixture: affine group quantisation along the input axis, group 64; 4 bits for every "
        "Linear, the embedding and lm_head, 8 bits for mlp.gate and mlp.shared_expert_gate; uint32 words "
        "with the lowest input index in the lowest bits; bf16 scales/biases; value = scale * q + bias. "
        "Quantiser: per group scale = bf16((max-min)/(2^bits-1)), bias = bf16(min), q = round((w-bias)/scale) "
        "clipped, computed after rounding scale and bias.",
        "The reference model is transformers' fp32 model with every quantised weight replaced by "
        "float32(scale)*q + float32(bias) (fp32 product then fp32 sum) and every zero-centred norm weight w "
        "replaced by float(bf16(1+w)) - 1, so 1+w equals the stored MLX norm weight exactly; A_log, dt_bias, "
        "conv1d and linear_attn.norm keep their bf16 values.",
        f"HF checkpoint it was converted from had expert layout '{saved_layout}' (not shipped).",
    ]
    extra = {"format": "mlx", "quantization": q, "reference_weights": "dequantised MLX weights",
             "mlx_crosscheck_max_abs": worst, "expert_layout": "switch_mlp (stacked)"}
    ref = write_reference(out_dir, name, spec, cfg, tokens, ev, dec, dec_cache, sem, notes, extra)
    rows, info, _ = tensor_listing(out_dir)
    results[name] = dict(layout="switch_mlp", spec=spec, state=st, ref=ref, rows=rows, shards=info["shards"],
                         sem=sem, size=dir_size(out_dir), cfg=cfg)
    finish_log(name, results[name])


def finish_log(name, r):
    ref, st = r["ref"], r["state"]
    log(f"  == {name}: family {ref['family']} {ref.get('architectures')}, seed {st['seed']} (tries {st['tries']}), "
        f"V {ref['vocab_size']} H {ref['hidden_size']} L {ref['num_layers']}, layout {r['layout']}, "
        f"files {r['shards']}, {r['size'] / 1e6:.3f} MB")
    log(f"     tokens {ref['tokens']} -> greedy {ref['greedy_new']} (min gap {ref['greedy_min_top2_gap']:.4g})")
    log(f"     max|prefill-decode| {ref['max_abs_prefill_vs_decode']:.3g}, logits std {ref['prefill_logits_std']:.3f}, "
        f"router min prob gap {ref['router_min_prob_gap']:.3g}, hidden_states[-1] {r['sem'][0]} "
        f"(|hs[-1]-raw| {r['sem'][1]:.3g}, |hs[-1]-norm(raw)| {r['sem'][2]:.3g})")
    tc = text_cfg(r["cfg"])
    E = int(tc.get("num_experts", 0))
    if E:
        log(f"     expert usage over prefill (all layers): {expert_usage(st['ev']['routers'], E)}")
    log(f"     randomised parameter groups: {st['counts']}")
    log(f"     config keys: {sorted(r['cfg'].keys())}")
    if "text_config" in r["cfg"]:
        log(f"     text_config keys: {sorted(r['cfg']['text_config'].keys())}")
        log(f"     text_config.rope_parameters: {r['cfg']['text_config'].get('rope_parameters')}")
    else:
        log(f"     rope: rope_parameters={r['cfg'].get('rope_parameters')} rope_theta={r['cfg'].get('rope_theta')} "
            f"partial_rotary_factor={r['cfg'].get('partial_rotary_factor')}")
    log(f"     layer_types: {tc.get('layer_types')} full_attention_interval: {tc.get('full_attention_interval')}")
    s = summarize_tensors(r["rows"])
    log(f"     tensors: {s['count']} {s['dtypes']}, visual {s['visual_count']}")
    for n, dt, shp in s["first"] + s["layer0_experts"] + s["visual_first"]:
        log(f"       {n} {dt} {shp}")


# ============================================================================ README

def write_readme(out_root, results, argv, elapsed):
    L = []
    L.append("# Reference fixtures (generated; do not edit by hand)\n")
    L.append("Tiny random-weight checkpoints of both families and transformers' fp32 reference outputs for them. "
             "Generated by `tools/reference/make_fixtures.py` "
             f"(transformers {transformers.__version__}, torch {torch.__version__}, CPU fp32, eager attention, eager experts).\n")
    L.append("Regenerate (needs torch + transformers 5.x; CPU is enough, ~1 min):\n")
    L.append("```\ncd tools/reference && python3 test_helpers.py   # numpy-only self-test of quantiser / layouts\n"
             "python3 make_fixtures.py --out /tmp/fx && rm -rf ../../tests/data/fixtures/* && cp -r /tmp/fx/* ../../tests/data/fixtures/\n"
             "python3 check_fixtures.py   # numpy-only forward pass written from the models' math (docs/model-math.md) vs the stored references\n```\n")
    L.append("Seeds are fixed, so a rerun with the same library versions reproduces the files bit for bit.\n")
    L.append("## Files in every fixture directory\n")
    L.append("- the checkpoint: `config.json` (+ `generation_config.json` for HF ones) and `model.safetensors` or shards + `model.safetensors.index.json`;\n"
             "- `reference.json`: `family` (top-level model_type), `tokens` (12 prompt ids, id 0, id V-1 and a thrice-repeated id included), "
             "`vocab_size` (lm_head rows), `hidden_size`, `num_layers`, `greedy_prompt` (= tokens), `greedy_new` (8 ids), "
             "`max_abs_prefill_vs_decode`, `greedy_min_top2_gap`, `router_min_prob_gap`, `expert_layout`, `notes`, ...;\n"
             "- `prefill_logits.f32`: little-endian float32, T x V, one full-sequence forward (no cache);\n"
             "- `decode_logits.f32`: T x V, tokens fed one at a time with the cache;\n"
             "- `hidden_states.f32`: (L+1) x T x H from `output_hidden_states=True`: entry 0 = embeddings, entry i = output of layer i-1 "
             "for i < L, and entry L = the last layer's output AFTER the final norm (transformers 5 overwrites the last entry with "
             "`last_hidden_state`; see `hidden_states_last_is_normed`);\n"
             "- `last_layer_output.f32`: T x H, the last decoder layer's raw output (before the final norm);\n"
             "- `router_topk.json`: per MoE layer, per prompt token, chosen experts (torch.topk order) and routing weights.\n")
    L.append("Greedy continuations come from repeated full-sequence forwards; seeds were chosen so that every greedy step has a "
             f"top-1/top-2 logit gap > {MIN_GREEDY_GAP} and every router's k-th/(k+1)-th probability gap > {MIN_ROUTER_GAP}.\n")
    L.append("Random weights: linear N(0, 1/sqrt(fan_in)) (lm_head x2), embeddings N(0,1) (tied: N(0, 2/sqrt(H)) so that "
             "logits stay O(1)), zero-centred norms N(0,0.2), linear_attn.norm 1+N(0,0.2), A_log log(U(1,16)), dt_bias N(0,0.5), "
             "conv1d N(0,0.3).\n")
    L.append("## transformers 5.17 behaviour seen while generating\n")
    saved = {n: r["ref"].get("expert_layout_as_saved_by_transformers") for n, r in results.items()
             if r["ref"].get("expert_layout_as_saved_by_transformers")}
    L.append(f"- `save_pretrained` (save_original_format=True) wrote these expert layouts: {saved}. transformers fuses "
             "experts in memory (`mlp.experts.gate_up_proj` [E, 2I, H], gate rows first; `mlp.experts.down_proj` [E, H, I]) "
             "and converts back on save; the qwen3_5_moe conversion comes from its text sub-model (`qwen3_5_moe_text`: "
             "PrefixChange `model.language_model.` + per-expert -> fused). Released Qwen3.5 checkpoints are fused, so q35_vl "
             "was rewritten to fused; both layouts load in transformers to identical logits (verified per fixture).\n"
             "- Configs written by transformers 5 have `layer_types` (no `full_attention_interval`), rope settings in "
             "`rope_parameters` {rope_type, rope_theta, partial_rotary_factor (+ mrope_interleaved, mrope_section for "
             "qwen3_5)}, `partial_rotary_factor` ALSO at the (text) config's top level, and `dtype` instead of `torch_dtype`. "
             "The release-style qwen3_next config of next_tied_sharded (legacy keys) reloads to identical logits.\n"
             "- `Qwen3_5MoeForCausalLM` saves model_type `qwen3_5_moe_text` (flat text config, architectures "
             "[Qwen3_5MoeForCausalLM]) with names `model.layers.*`, `model.embed_tokens`, `model.norm`, `lm_head` (no "
             "`language_model`).\n"
             "- `output_hidden_states`: L+1 entries; the last one is overwritten by the final-normed `last_hidden_state`.\n"
             "- Without fla / causal-conv1d (not installed) the torch fallbacks run: chunked gated delta rule for prefill "
             "(chunk 64), recurrent rule for 1-token decode.\n")
    L.append("## Fixtures\n")
    total = 0
    for name in ORDER:
        r = results.get(name)
        if r is None:
            L.append(f"### {name}\n\nNOT GENERATED (see the generation log).\n")
            continue
        ref, st, cfg = r["ref"], r["state"], r["cfg"]
        tc = text_cfg(cfg)
        total += r["size"]
        L.append(f"### {name}\n")
        L.append(r["spec"]["covers"] + "\n")
        L.append(f"- class `{r['spec']['cls']}`, family (model_type) `{ref['family']}`, architectures {ref.get('architectures')}\n"
                 f"- V={ref['vocab_size']} H={ref['hidden_size']} L={ref['num_layers']}, heads {tc.get('num_attention_heads')}/"
                 f"{tc.get('num_key_value_heads')} x head_dim {tc.get('head_dim')}, linear key/value heads "
                 f"{tc.get('linear_num_key_heads')}/{tc.get('linear_num_value_heads')} x {tc.get('linear_key_head_dim')}/"
                 f"{tc.get('linear_value_head_dim')}, experts {tc.get('num_experts')} top-{tc.get('num_experts_per_tok')} "
                 f"(I={tc.get('moe_intermediate_size')}, shared {tc.get('shared_expert_intermediate_size')}), tied "
                 f"{ref.get('tied_embeddings', False)}\n"
                 f"- layer_types {tc.get('layer_types')}; full_attention_interval {tc.get('full_attention_interval')}\n"
                 f"- rope: rope_parameters {tc.get('rope_parameters')}; top-level rope_theta {tc.get('rope_theta')}, "
                 f"partial_rotary_factor {tc.get('partial_rotary_factor')}\n"
                 f"- expert layout: **{r['layout']}**; files {r['shards']}; {r['size'] / 1e6:.3f} MB\n"
                 f"- seed {st['seed']}; tokens {ref['tokens']} -> greedy {ref['greedy_new']}; max|prefill-decode| "
                 f"{ref['max_abs_prefill_vs_decode']:.2g}; logits std {ref['prefill_logits_std']:.2f}\n")
        L.append(f"- config.json keys: {', '.join(sorted(cfg.keys()))}\n")
        if "text_config" in cfg:
            L.append(f"- text_config keys: {', '.join(sorted(cfg['text_config'].keys()))}\n")
        if ref.get("quantization"):
            L.append(f"- quantization: `{json.dumps(ref['quantization'])}`\n")
        s = summarize_tensors(r["rows"])
        L.append(f"\nTensors: {s['count']} ({', '.join(f'{k}: {v}' for k, v in s['dtypes'].items())}); first ones and layer 0 experts:\n")
        L.append("```")
        for n, dt, shp in s["first"] + s["layer0_experts"] + s["visual_first"]:
            L.append(f"{n}  {dt}  {shp}")
        if s["visual_count"]:
            L.append(f"... {s['visual_count']} model.visual.* tensors in all")
        L.append("```\n")
        L.append("Notes: " + ref["notes"] + "\n")
    L.append(f"Total size: {total / 1e6:.2f} MB.\n")
    if FAILURES:
        L.append("## Problems during generation\n")
        for fmsg in FAILURES:
            L.append(f"- {fmsg}")
    with open(os.path.join(out_root, "README.md"), "w") as f:
        f.write("\n".join(L) + "\n")


# ============================================================================ main

def print_facts():
    log(f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"numpy {np.__version__}, threads {torch.get_num_threads()}")
    for c in ("Qwen3NextForCausalLM", "Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration",
              "Qwen3_5MoeTextConfig", "Qwen3_5MoeConfig", "Qwen3NextConfig"):
        log(f"  transformers.{c}: {'yes' if hasattr(transformers, c) else 'MISSING'}")
    try:
        from transformers import PreTrainedModel
        log(f"  save_pretrained{inspect.signature(PreTrainedModel.save_pretrained)}")
    except Exception as e:  # noqa: BLE001
        log(f"  (no signature: {e})")
    try:
        from transformers.utils.import_utils import is_flash_linear_attention_available, is_causal_conv1d_available
        log(f"  fla available: {is_flash_linear_attention_available()}, causal_conv1d: {is_causal_conv1d_available()}")
    except Exception as e:  # noqa: BLE001
        log(f"  (fla check failed: {e})")
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
        for mt in ("qwen3_next", "qwen3_5_moe", "qwen3_5_moe_text"):
            m = get_checkpoint_conversion_mapping(mt)
            log(f"  conversion mapping {mt}: {[type(x).__name__ + ':' + str(getattr(x, 'source_patterns', '')) for x in (m or [])]}")
    except Exception as e:  # noqa: BLE001
        log(f"  (conversion mapping check failed: {e})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    t0 = time.time()
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    print_facts()
    out_root = os.path.abspath(args.out)
    os.makedirs(out_root, exist_ok=True)
    work = os.path.join(out_root, "..", os.path.basename(out_root) + "_work")
    os.makedirs(work, exist_ok=True)
    only = [x for x in args.only.split(",") if x]
    results = {}
    for name in ORDER:
        if only and name not in only:
            continue
        spec = FIXTURES[name]
        log(f"\n=== {name} ({spec['cls']}) ===")
        t1 = time.time()
        try:
            if spec["kind"] == "hf":
                make_hf(name, spec, out_root, work, results)
            else:
                make_mlx(name, spec, out_root, work, results)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            sys.stdout.flush()
            FAILURES.append(f"{name}: {type(e).__name__}: {str(e)[:300]}")
        log(f"  ({time.time() - t1:.1f} s)")
    write_readme(out_root, results, sys.argv, time.time() - t0)
    total = sum(r["size"] for r in results.values())
    log(f"\nTotal fixture size {total / 1e6:.2f} MB, elapsed {time.time() - t0:.1f} s")
    if FAILURES:
        log("FAILURES:\n  " + "\n  ".join(FAILURES))
    else:
        log("ALL OK")


if __name__ == "__main__":
    main()
