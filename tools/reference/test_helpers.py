"""Self-test of st_io and fixture_lib (numpy only): python3 test_helpers.py"""

import os
import tempfile

import numpy as np

import fixture_lib as fl
import st_io
from st_io import Tensor


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)
    print("ok:", msg)


def main():
    rng = np.random.default_rng(0)
    # bf16 rounding: ties to even and exactness on bf16 values
    x = np.array([1.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -2.5, 3.14159, 1e-30], dtype=np.float32)
    r = st_io.round_bf16(x)
    check(r[1] == 1.0 and r[2] == 1.0 + 4 * 2 ** -8 and r[3] == -2.5, "bf16 round half to even")
    v = st_io.round_bf16(rng.standard_normal(1000).astype(np.float32))
    check(np.array_equal(st_io.round_bf16(v), v), "bf16 rounding idempotent")

    # packing order: lowest input index in the lowest bits
    w = np.tile(np.arange(16, dtype=np.float32), 4)[None, :]  # one row, 64 inputs, values 0..15
    packed, sb, bb = fl.quantize(w, 4)
    check(packed.shape == (1, 8) and sb.shape == (1, 1), "4-bit shapes")
    check(int(packed[0, 0]) == 0x76543210 and int(packed[0, 1]) == 0xFEDCBA98, "4-bit nibble order")
    check(st_io.bf16_bits_to_f32(sb)[0, 0] == 1.0 and st_io.bf16_bits_to_f32(bb)[0, 0] == 0.0, "scale/bias")
    w8 = np.arange(64, dtype=np.float32)[None, :]
    w8[0, -1] = 255.0
    p8, s8, b8 = fl.quantize(w8, 8)
    check(p8.shape == (1, 16) and int(p8[0, 0]) == 0x03020100, "8-bit byte order")
    check(np.array_equal(fl.dequantize(p8, s8, b8, 8), w8), "8-bit exact on a ramp")

    # random qdq error bounds
    for bits in (4, 8):
        w = st_io.round_bf16(rng.standard_normal((3, 5, 128)).astype(np.float32) * 0.1)
        p, s, b = fl.quantize(w, bits)
        d = fl.dequantize(p, s, b, bits)
        sc = st_io.bf16_bits_to_f32(s)
        err = np.abs(d - w).reshape(3, 5, 2, 64).max(-1)
        check(np.all(err <= sc * 0.5 + 1e-2 * sc + 1e-7 + np.abs(st_io.bf16_bits_to_f32(b)) * 2 ** -7),
              f"{bits}-bit error within half a step (+bf16 bias rounding)")
        q = fl.unpack(p, bits)
        check(q.max() <= (1 << bits) - 1 and q.shape == w.shape, f"{bits}-bit unpack")
        # rows are independent: quantising halves separately equals quantising the whole
        p1, _, _ = fl.quantize(w[:, :2], bits)
        check(np.array_equal(p1, p[:, :2]), f"{bits}-bit rows independent")

    # expert layout round trip
    E, I, H = 3, 4, 64
    t = {}
    for e in range(E):
        for p, shp in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
            t[f"model.layers.0.mlp.experts.{e}.{p}.weight"] = Tensor(
                "BF16", st_io.f32_to_bf16_bits(rng.standard_normal(shp).astype(np.float32)))
    t["model.embed_tokens.weight"] = Tensor("BF16", st_io.f32_to_bf16_bits(rng.standard_normal((10, H))))
    check(fl.expert_layout(t) == "per_expert", "layout per_expert")
    f = fl.to_fused(t)
    check(fl.expert_layout(f) == "fused", "layout fused")
    gu = f["model.layers.0.mlp.experts.gate_up_proj"].data
    check(gu.shape == (E, 2 * I, H) and np.array_equal(gu[1, :I], t["model.layers.0.mlp.experts.1.gate_proj.weight"].data)
          and np.array_equal(gu[1, I:], t["model.layers.0.mlp.experts.1.up_proj.weight"].data), "fused gate first")
    back = fl.to_per_expert(f)
    check(set(back) == set(t) and all(np.array_equal(back[k].data, t[k].data) for k in t), "layout round trip")

    # safetensors IO, sharded
    with tempfile.TemporaryDirectory() as d:
        t["x.u32"] = Tensor("U32", np.arange(6, dtype=np.uint32).reshape(2, 3))
        t["x.f32"] = Tensor("F32", np.linspace(0, 1, 5, dtype=np.float32))
        files = st_io.save_dir(t, d, n_shards=3, metadata={"format": "pt"})
        check(len(files) == 3 and os.path.exists(os.path.join(d, "model.safetensors.index.json")), "3 shards + index")
        r, info = st_io.load_dir(d)
        check(info["sharded"] and set(r) == set(t), "sharded load keys")
        check(all(r[k].dtype == t[k].dtype and np.array_equal(r[k].data, t[k].data) for k in t), "sharded load values")
        hdr, base = st_io.read_header(os.path.join(d, files[0]))
        check(base % 8 == 0 and hdr["__metadata__"] == {"format": "pt"}, "aligned header with metadata")

    # HF -> MLX conversion and cross-check against reference_param (Qwen3.5-style names, fused)
    H, I, E, V, C, K = 128, 64, 4, 96, 40, 4
    bf = lambda a: Tensor("BF16", st_io.f32_to_bf16_bits(np.asarray(a, dtype=np.float32)))
    hf = {
        "model.language_model.embed_tokens.weight": bf(rng.standard_normal((V, H))),
        "lm_head.weight": bf(rng.standard_normal((V, H)) * 0.1),
        "model.language_model.norm.weight": bf(rng.standard_normal(H) * 0.2),
        "model.language_model.layers.0.input_layernorm.weight": bf(rng.standard_normal(H) * 0.2),
        "model.language_model.layers.0.linear_attn.norm.weight": bf(1 + rng.standard_normal(16) * 0.2),
        "model.language_model.layers.0.linear_attn.conv1d.weight": bf(rng.standard_normal((C, 1, K))),
        "model.language_model.layers.0.linear_attn.A_log": bf(np.log(rng.uniform(1, 16, 4))),
        "model.language_model.layers.0.linear_attn.in_proj_qkv.weight": bf(rng.standard_normal((C, H)) * 0.1),
        "model.language_model.layers.0.mlp.gate.weight": bf(rng.standard_normal((E, H)) * 0.1),
        "model.language_model.layers.0.mlp.shared_expert_gate.weight": bf(rng.standard_normal((1, H)) * 0.1),
        "model.language_model.layers.0.mlp.experts.gate_up_proj": bf(rng.standard_normal((E, 2 * I, H)) * 0.1),
        "model.language_model.layers.0.mlp.experts.down_proj": bf(rng.standard_normal((E, H, I)) * 0.1),
        "model.language_model.layers.0.self_attn.q_norm.weight": bf(rng.standard_normal(32) * 0.2),
        "model.visual.blocks.0.norm1.weight": bf(np.ones(8)),
        "mtp.fc.weight": bf(np.ones((2, 2))),
    }
    mlx, overrides, log = fl.hf_to_mlx(hf, vl_prefix=True)
    names = sorted(mlx)
    print("\n".join(f"   {n} {mlx[n].dtype} {mlx[n].shape}" for n in names))
    check(not any("visual" in n or n.startswith("mtp") for n in names), "vision and mtp dropped")
    check(mlx["language_model.model.layers.0.mlp.switch_mlp.gate_proj.weight"].shape == [E, I, H // 8], "switch gate packed")
    check(mlx["language_model.model.layers.0.mlp.switch_mlp.down_proj.scales"].shape == [E, H, I // 64], "switch down scales")
    check(mlx["language_model.model.layers.0.linear_attn.conv1d.weight"].shape == [C, K, 1], "conv transposed")
    check(mlx["language_model.lm_head.weight"].dtype == "U32", "lm_head quantised")
    check(set(overrides) == {"language_model.model.layers.0.mlp.gate",
                             "language_model.model.layers.0.mlp.shared_expert_gate"}, "8-bit overrides")
    check(mlx["language_model.model.layers.0.mlp.gate.weight"].shape == [E, H // 4], "router 8-bit packed")
    ln = mlx["language_model.model.layers.0.linear_attn.norm.weight"].to_f32()
    check(np.array_equal(ln, hf["model.language_model.layers.0.linear_attn.norm.weight"].to_f32()), "linear_attn.norm untouched")
    view = fl.mlx_to_hf_view(mlx, vl_prefix=True)
    worst = 0.0
    for n, t in hf.items():
        if "visual" in n or n.startswith("mtp"):
            continue
        a = t.to_f32()
        ref = fl.reference_param(n, a)
        ref = a if ref is None else ref
        got = view[n]
        if fl.is_zero_centred_norm(n):
            # 1 + w must be exact
            check(np.array_equal(np.float32(1) + ref, np.float32(1) + got), f"norm 1+w exact: {n}")
            continue
        worst = max(worst, float(np.abs(ref - got).max()))
    check(worst == 0.0, f"MLX dequantisation == reference weights (max diff {worst})")


if __name__ == "__main__":
    main()
