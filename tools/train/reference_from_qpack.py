#!/usr/bin/env python3
"""transformers' reference outputs for a trained model's .qpack, computed on exactly the weights the
container holds.

Usage (GPU machine, or any machine with torch + transformers 5.x):
    reference_from_qpack.py --qpack MODEL.qpack --test TEST.txt[.xz] --out DIR

The container's tensors are read (MLX names; quantised tensors dequantised as value = scale x q +
bias; packed experts stacked back into switch_mlp tensors) and turned into a transformers
Qwen3-Next model in float64 with eager experts and attention (tools/reference/fixture_lib.py does
the MLX -> HF view). Written to DIR:
  reference.json   greedy continuations of chat prompts (full-sequence forwards, float64), the
                   smallest top-1/top-2 logit gap along each, the perplexity of the test text's
                   first windows (float64, `swiftlet perplexity`'s definition) and of the whole test
                   text (float32, and bfloat16: the weights and activations as a bf16 checkpoint
                   runs in transformers)
  logits_N.f32     the float64 logits at the last prompt position of prompt N, as float32
  test_slice.txt   the test text's first documents, enough for the windows scored in reference.json
"""

import argparse
import json
import lzma
import math
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import fixture_lib as fl  # noqa: E402
import st_io  # noqa: E402
from train_small import EOT_ID, IM_END_ID, chat_prompt, perplexity, tokenize  # noqa: E402

PROMPTS = ['What does the word "harbor" mean?', "What is a dog?", "Define happiness.",
           "What does Genesis 1:1 say?", "What is a compiler in computing?", "Why is the sky blue?"]


def split_row_order(cfg, fused):
    """Row i of a fused DeltaNet input in the split order is row order[i] of the grouped one
    (docs/qpack.md 4; as split_row_order in src/model/weights.cpp)."""
    hk = cfg["linear_num_key_heads"]
    r = cfg["linear_num_value_heads"] // hk
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    if fused == "qkvz":
        group = 2 * dk + 2 * r * dv
        order = [g * group + part * dk + i for part in range(2) for g in range(hk) for i in range(dk)]
        order += [g * group + 2 * dk + part * r * dv + i for part in range(2) for g in range(hk)
                  for i in range(r * dv)]
        return np.array(order)
    return np.array([g * 2 * r + part * r + j for part in range(2) for g in range(hk) for j in range(r)])


def to_grouped(tensors, cfg):
    """Fuses the split DeltaNet inputs swiftlet-repack writes for Qwen3-Next (in_proj_qkv + in_proj_z,
    in_proj_b + in_proj_a) back into the grouped in_proj_qkvz / in_proj_ba transformers reads
    (whole rows: quantised rows move with their scales and biases). Qwen3.5 keeps them split."""
    if cfg.get("model_type") != "qwen3_next":
        return
    for name in [n for n in tensors if ".linear_attn.in_proj_qkv." in n or ".linear_attn.in_proj_b." in n]:
        fused, first, second = (("qkvz", "in_proj_qkv.", "in_proj_z.") if "in_proj_qkv." in name
                                else ("ba", "in_proj_b.", "in_proj_a."))
        other = name.replace(first, second)
        t, u = tensors.pop(name), tensors.pop(other)
        split = np.concatenate([t.data, u.data])
        grouped = np.empty_like(split)
        grouped[split_row_order(cfg, fused)] = split
        tensors[name.replace(first, "in_proj_" + fused + ".")] = st_io.Tensor(t.dtype, grouped)


def read_qpack(d):
    tensors, _ = st_io.load_file(os.path.join(d, "model.safetensors"))
    with open(os.path.join(d, "config.json")) as fh:
        to_grouped(tensors, json.load(fh))
    with open(os.path.join(d, "packed_experts", "layout.json")) as fh:
        layout = json.load(fh)
    E, stride = layout["expertCount"], layout["expertStride"]
    for layer in range(layout["layerCount"]):
        blob = np.fromfile(os.path.join(d, "packed_experts", f"layer_{layer:02d}.bin"), dtype=np.uint8)
        blob = blob.reshape(E, stride)
        for s in layout["sections"]:
            np_dt = st_io._NP_OF[s["dtype"]]
            raw = np.ascontiguousarray(blob[:, s["offset"]:s["offset"] + s["size"]])
            arr = raw.view(np_dt).reshape(E, *s["shape"])
            tensors[f"model.layers.{layer}.mlp.switch_mlp.{s['name']}"] = st_io.Tensor(s["dtype"], arr)
    return tensors


def build_model(d):
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
    with open(os.path.join(d, "config.json")) as fh:
        cfg = json.load(fh)
    for k in ("quantization", "quantization_config"):
        cfg.pop(k, None)
    config = Qwen3NextConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    config._experts_implementation = "eager"
    config._attn_implementation = "eager"
    model = Qwen3NextForCausalLM(config).to(torch.float64).eval()
    view = fl.mlx_to_hf_view(read_qpack(d), vl_prefix=False)
    sd = model.state_dict()
    loaded = 0
    with torch.no_grad():
        for name, p in sd.items():
            if name == "lm_head.weight" and config.tie_word_embeddings:
                continue
            if name not in view:
                raise KeyError(f"{name} is not in the container")
            v = torch.from_numpy(np.ascontiguousarray(view.pop(name))).to(torch.float64)
            if tuple(v.shape) != tuple(p.shape):
                raise ValueError(f"{name}: container {tuple(v.shape)} vs model {tuple(p.shape)}")
            p.copy_(v)
            loaded += 1
    if view:
        raise ValueError(f"container tensors the model does not use: {sorted(view)[:8]}")
    print(f"loaded {loaded} tensors", flush=True)
    return model


@torch.no_grad()
def greedy(model, ids, n):
    dev = next(model.parameters()).device
    x = torch.tensor(ids, device=dev)[None]
    out, gaps, last_logits = [], [], None
    for i in range(n):
        logits = model(input_ids=x, use_cache=False).logits[0, -1]
        if i == 0:
            last_logits = logits.float().cpu().numpy()
        top = torch.topk(logits, 2)
        gaps.append(float(top.values[0] - top.values[1]))
        nxt = int(top.indices[0])
        out.append(nxt)
        if nxt in (IM_END_ID, EOT_ID):
            break
        x = torch.cat([x, torch.tensor([[nxt]], device=dev)], 1)
    return out, gaps, last_logits


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qpack", required=True)
    ap.add_argument("--test", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--new", type=int, default=24)
    ap.add_argument("--slice-windows", type=int, default=4)
    ap.add_argument("--tokenizer", default="",
                    help="directory with tokenizer.json (default: the container's own, when stored plain)")
    args = ap.parse_args()
    from tokenizers import Tokenizer

    os.makedirs(args.out, exist_ok=True)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tok = Tokenizer.from_file(os.path.join(args.tokenizer or args.qpack, "tokenizer.json"))
    model = build_model(args.qpack).to(dev)
    ref = {"prompts": []}
    for i, q in enumerate(PROMPTS):
        ids = tok.encode(chat_prompt(q), add_special_tokens=False).ids
        out, gaps, logits = greedy(model, ids, args.new)
        logits.astype("<f4").tofile(os.path.join(args.out, f"logits_{i}.f32"))
        ref["prompts"].append({"question": q, "prompt_ids": ids, "greedy_ids": out, "min_gap": min(gaps),
                               "gaps": [round(g, 5) for g in gaps], "text": tok.decode(out, skip_special_tokens=False)})
        print(f"{q!r} -> {tok.decode(out, skip_special_tokens=False)!r} (min gap {min(gaps):.4g})", flush=True)

    if args.test.endswith(".xz"):
        with lzma.open(args.test, "rt", encoding="utf-8") as fh:
            text = fh.read()
    else:
        with open(args.test, encoding="utf-8") as fh:
            text = fh.read()
    # The slice: whole documents from the start, until the windows to score are covered.
    docs = text.split("<|endoftext|>")[:-1]
    need = args.slice_windows * 512
    k, n_tok = 0, 0
    while n_tok < need:
        n_tok += len(tok.encode(docs[k], add_special_tokens=False).ids) + 1
        k += 1
    slice_text = "".join(d + "<|endoftext|>" for d in docs[:k])
    with open(os.path.join(args.out, "test_slice.txt"), "w", encoding="utf-8") as fh:
        fh.write(slice_text)
    ids = tokenize(tok, slice_text)
    r = perplexity(model, ids, max_windows=args.slice_windows)
    ref["slice"] = {"documents": k, "tokens": int(len(ids)), **{a: b for a, b in r.items()}}
    print(f"slice: {k} documents, {len(ids)} tokens, ppl {r['ppl']:.6f} over {r['scored']} tokens (float64)", flush=True)

    test_ids = tokenize(tok, text)
    for name, dtype in (("test_fp32", torch.float32), ("test_bf16", torch.bfloat16)):
        r = perplexity(model.to(dtype), test_ids)
        ref[name] = {a: b for a, b in r.items() if a != "window_nll"}
        print(f"whole test text: ppl {r['ppl']:.4f} over {r['scored']} tokens, {r['windows']} windows ({dtype})",
              flush=True)
    with open(os.path.join(args.out, "reference.json"), "w") as fh:
        json.dump(ref, fh, indent=1)


if __name__ == "__main__":
    main()
