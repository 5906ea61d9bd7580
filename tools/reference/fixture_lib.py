"""Checkpoint rewrites used by make_fixtures.py, on numpy only (no torch needed):

- expert layout rewrites between per-expert tensors (`mlp.experts.N.gate_proj.weight` ...) and
  fused tensors (`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj` [E, H, I]);
- an MLX affine group quantiser (mlx `affine_quantize` layout: uint32 words, lowest input index in
  the lowest bits; bf16 scales and biases; value = scale * q + bias);
- the conversion of an HF bf16 checkpoint into the directory mlx-lm's convert would write after its
  sanitize step (switch_mlp stacking, conv1d transpose, 1 + w norms, Qwen3.5 renames).
"""

import re

import numpy as np

from st_io import Tensor, bf16_bits_to_f32, f32_to_bf16_bits, round_bf16

GROUP_SIZE = 64

# ----------------------------------------------------------------------------- expert layouts

_PER_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_FUSED = re.compile(r"^(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$")


def expert_layout(tensors):
    per = any(_PER_EXPERT.match(n) for n in tensors)
    fused = any(_FUSED.match(n) for n in tensors)
    if per and fused:
        return "mixed"
    return "per_expert" if per else ("fused" if fused else "none")


def to_fused(tensors):
    """per-expert -> fused; other tensors unchanged. Exact (pure data movement)."""
    out = {}
    groups = {}
    for n, t in tensors.items():
        m = _PER_EXPERT.match(n)
        if not m:
            out[n] = t
            continue
        groups.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[m.group(3)] = t
    for prefix, experts in groups.items():
        E = len(experts)
        if sorted(experts) != list(range(E)):
            raise ValueError(f"{prefix}: experts are not 0..{E - 1}")
        dts = {t.dtype for e in experts.values() for t in e.values()}
        if len(dts) != 1:
            raise ValueError(f"{prefix}: mixed dtypes {dts}")
        dt = dts.pop()
        gu = np.stack([np.concatenate([experts[e]["gate_proj"].data, experts[e]["up_proj"].data], 0)
                       for e in range(E)])
        dn = np.stack([experts[e]["down_proj"].data for e in range(E)])
        out[prefix + ".gate_up_proj"] = Tensor(dt, gu)
        out[prefix + ".down_proj"] = Tensor(dt, dn)
    return out


def to_per_expert(tensors):
    """fused -> per-expert; gate is the first half of dim 1 of gate_up_proj."""
    out = {}
    for n, t in tensors.items():
        m = _FUSED.match(n)
        if not m:
            out[n] = t
            continue
        prefix, kind = m.group(1), m.group(2)
        E = t.data.shape[0]
        if kind == "gate_up_proj":
            two_i = t.data.shape[1]
            if two_i % 2:
                raise ValueError(f"{n}: odd dim 1")
            i = two_i // 2
            for e in range(E):
                out[f"{prefix}.{e}.gate_proj.weight"] = Tensor(t.dtype, t.data[e, :i])
                out[f"{prefix}.{e}.up_proj.weight"] = Tensor(t.dtype, t.data[e, i:])
        else:
            for e in range(E):
                out[f"{prefix}.{e}.down_proj.weight"] = Tensor(t.dtype, t.data[e])
    return out


# ----------------------------------------------------------------------------- quantiser

def quantize(w, bits, group=GROUP_SIZE):
    """Affine group quantisation along the last axis.

    w: float array [..., n_in] (n_in % group == 0).
    Per group: scale = bf16((max - min) / (2^bits - 1)), bias = bf16(min),
    q = clip(round_half_even((w - bias) / scale), 0, 2^bits - 1)   (fp32 arithmetic).
    Returns (packed uint32 [..., n_in * bits / 32], scale bf16 bits [..., n_in/group],
    bias bf16 bits [..., n_in/group]).
    """
    if bits not in (2, 4, 8):
        raise ValueError("bits must be 2, 4 or 8")
    w = np.asarray(w, dtype=np.float32)
    lead, n_in = w.shape[:-1], w.shape[-1]
    if n_in % group:
        raise ValueError(f"input dim {n_in} is not a multiple of {group}")
    g = w.reshape(-1, n_in // group, group)
    levels = (1 << bits) - 1
    wmin = g.min(-1)
    wmax = g.max(-1)
    scale_bits = f32_to_bf16_bits((wmax - wmin) / np.float32(levels))
    bias_bits = f32_to_bf16_bits(wmin)
    scale = bf16_bits_to_f32(scale_bits)[..., None]
    bias = bf16_bits_to_f32(bias_bits)[..., None]
    safe = np.where(scale == 0, np.float32(1), scale).astype(np.float32)
    q = np.rint((g - bias) / safe)
    q = np.where(scale == 0, 0, q)
    q = np.clip(q, 0, levels).astype(np.uint32).reshape(-1, n_in)
    per = 32 // bits
    q = q.reshape(q.shape[0], n_in // per, per)
    packed = np.zeros(q.shape[:2], dtype=np.uint32)
    for j in range(per):
        packed |= q[:, :, j] << np.uint32(bits * j)
    return (packed.reshape(*lead, n_in // per),
            scale_bits.reshape(*lead, n_in // group),
            bias_bits.reshape(*lead, n_in // group))


def unpack(packed, bits):
    packed = np.asarray(packed, dtype=np.uint32)
    per = 32 // bits
    mask = np.uint32((1 << bits) - 1)
    q = np.stack([(packed >> np.uint32(bits * j)) & mask for j in range(per)], axis=-1)
    return q.reshape(*packed.shape[:-1], packed.shape[-1] * per)


def dequantize(packed, scale_bits, bias_bits, bits, group=GROUP_SIZE):
    """value = scale * q + bias, in float32 (product rounded, then sum rounded)."""
    q = unpack(packed, bits).astype(np.float32)
    n_in = q.shape[-1]
    qg = q.reshape(*q.shape[:-1], n_in // group, group)
    s = bf16_bits_to_f32(scale_bits)[..., None]
    b = bf16_bits_to_f32(bias_bits)[..., None]
    return (s * qg + b).astype(np.float32).reshape(q.shape)


def qdq(w, bits, group=GROUP_SIZE):
    return dequantize(*quantize(w, bits, group), bits, group)


def bits_for_path(path):
    """mlx-lm quant_predicate of qwen3_next / qwen3_5: router and shared expert gate at 8 bits."""
    if path.endswith("mlp.gate") or path.endswith("shared_expert_gate"):
        return 8
    return 4


# ----------------------------------------------------------------------------- HF -> MLX

_ZC_SUFFIXES = ("input_layernorm.weight", "post_attention_layernorm.weight",
                "self_attn.q_norm.weight", "self_attn.k_norm.weight")


def is_zero_centred_norm(name):
    """Norms that compute x * (1 + w): all except linear_attn.norm (works on HF and MLX names)."""
    if "linear_attn.norm" in name:
        return False
    return (name.endswith(_ZC_SUFFIXES) or name.endswith("model.norm.weight")
            or name == "model.language_model.norm.weight")


def mlx_name(name):
    """HF checkpoint name -> mlx-lm name, or None when mlx-lm drops the tensor."""
    if name.startswith("mtp.") or name.startswith("model.visual.") or name.startswith("visual."):
        return None
    if name.startswith("model.language_model."):
        return "language_model.model." + name[len("model.language_model."):]
    if name == "lm_head.weight":
        return None  # decided by the caller (prefix depends on the family)
    return name


def hf_to_mlx(tensors, vl_prefix, group=GROUP_SIZE):
    """Convert an HF bf16 checkpoint (dict of st_io.Tensor) into MLX 4-bit tensors.

    vl_prefix: True for Qwen3.5 (names become language_model.model.* / language_model.lm_head).
    Returns (mlx_tensors, quant_overrides {path: {"group_size", "bits"}}, log lines).
    """
    log = []
    floats = {}   # mlx name -> float32 array (bf16 values) still to be finished
    dtypes = {}
    experts = {}  # mlx prefix ".../mlp" -> {e: {proj: arr}} or fused arrays
    for n, t in tensors.items():
        if n == "lm_head.weight":
            m = "language_model.lm_head.weight" if vl_prefix else "lm_head.weight"
        else:
            m = mlx_name(n)
        if m is None:
            continue
        pe = _PER_EXPERT.match(m)
        fu = _FUSED.match(m)
        if pe:
            pref = pe.group(1)[: -len(".experts")]
            experts.setdefault(pref, {}).setdefault(int(pe.group(2)), {})[pe.group(3)] = t.to_f32()
            continue
        if fu:
            pref = fu.group(1)[: -len(".experts")]
            arr = t.to_f32()
            d = experts.setdefault(pref, {})
            if fu.group(2) == "gate_up_proj":
                i = arr.shape[1] // 2
                d["fused_gate"] = arr[:, :i]
                d["fused_up"] = arr[:, i:]
            else:
                d["fused_down"] = arr
            continue
        floats[m] = t.to_f32()
        dtypes[m] = t.dtype
    for pref, d in experts.items():
        if "fused_gate" in d or "fused_down" in d:
            stacks = {"gate_proj": d["fused_gate"], "up_proj": d["fused_up"], "down_proj": d["fused_down"]}
        else:
            E = len(d)
            stacks = {p: np.stack([d[e][p] for e in range(E)]) for p in ("gate_proj", "up_proj", "down_proj")}
        for p, arr in stacks.items():
            floats[f"{pref}.switch_mlp.{p}.weight"] = arr
            dtypes[f"{pref}.switch_mlp.{p}.weight"] = "BF16"

    out = {}
    overrides = {}
    for m in sorted(floats):
        arr = floats[m]
        if m.endswith("conv1d.weight"):
            out[m] = Tensor("BF16", f32_to_bf16_bits(np.ascontiguousarray(np.swapaxes(arr, 1, 2))))
            continue
        if is_zero_centred_norm(m):
            out[m] = Tensor("BF16", f32_to_bf16_bits(arr + np.float32(1)))
            continue
        if m.endswith(".weight") and arr.ndim >= 2:
            path = m[: -len(".weight")]
            if arr.shape[-1] % group:
                log.append(f"not quantised (input dim {arr.shape[-1]}): {m}")
                out[m] = Tensor("BF16", f32_to_bf16_bits(arr))
                continue
            bits = bits_for_path(path)
            packed, sb, bb = quantize(arr, bits, group)
            out[path + ".weight"] = Tensor("U32", packed)
            out[path + ".scales"] = Tensor("BF16", sb)
            out[path + ".biases"] = Tensor("BF16", bb)
            if bits != 4:
                overrides[path] = {"group_size": group, "bits": bits}
            continue
        out[m] = Tensor("BF16" if dtypes.get(m, "BF16") == "BF16" else "F32",
                        f32_to_bf16_bits(arr) if dtypes.get(m, "BF16") == "BF16" else arr)
    return out, overrides, log


def reference_param(name, arr, group=GROUP_SIZE):
    """The value an HF (in-memory, fused-experts) parameter must take so that transformers computes
    exactly what the MLX checkpoint holds. Returns None when the parameter stays as it is.

    arr: float32 numpy array holding the bf16 value of the parameter.
    """
    if "visual" in name or name.startswith("mtp."):
        return None
    if arr.ndim == 1 and is_zero_centred_norm(name):
        # MLX stores bf16(1 + w); HF computes 1 + w in fp32, so use w' = bf16(1 + w) - 1 (exact).
        return (round_bf16(arr + np.float32(1)) - np.float32(1)).astype(np.float32)
    if name.endswith("conv1d.weight"):
        return None
    if _FUSED.match(name) and arr.ndim == 3:
        if arr.shape[-1] % group:
            return None
        return qdq(arr, 4, group)
    if name.endswith(".weight") and arr.ndim == 2:
        if arr.shape[-1] % group:
            return None
        return qdq(arr, bits_for_path(name[: -len(".weight")]), group)
    return None


def mlx_to_hf_view(mlx_tensors, vl_prefix):
    """Dequantise an MLX tensor dict back into HF in-memory names and layout (fused experts,
    conv1d [C,1,K], norms as w = stored - 1), as float32 arrays; used to cross-check."""
    out = {}
    done = set()
    for n in sorted(mlx_tensors):
        if n in done:
            continue
        if n.endswith(".scales") or n.endswith(".biases"):
            continue
        t = mlx_tensors[n]
        if t.dtype == "U32":
            path = n[: -len(".weight")]
            bits = 32 * t.data.shape[-1] // (mlx_tensors[path + ".scales"].data.shape[-1] * GROUP_SIZE)
            val = dequantize(t.data, mlx_tensors[path + ".scales"].data, mlx_tensors[path + ".biases"].data, bits)
        else:
            val = t.to_f32()
        if vl_prefix:
            if n.startswith("language_model.model."):
                hn = "model.language_model." + n[len("language_model.model."):]
            elif n.startswith("language_model.lm_head"):
                hn = n[len("language_model."):]
            else:
                hn = n
        else:
            hn = n
        if n.endswith("conv1d.weight"):
            val = np.swapaxes(val, 1, 2)
        elif is_zero_centred_norm(n):
            val = val - np.float32(1)
        out[hn] = val
    # fuse switch_mlp back to experts.gate_up_proj / down_proj
    fused = {}
    for hn in list(out):
        m = re.match(r"^(.*\.mlp)\.switch_mlp\.(gate_proj|up_proj|down_proj)\.weight$", hn)
        if m:
            fused.setdefault(m.group(1), {})[m.group(2)] = out.pop(hn)
    for pref, d in fused.items():
        out[pref + ".experts.gate_up_proj"] = np.concatenate([d["gate_proj"], d["up_proj"]], axis=1)
        out[pref + ".experts.down_proj"] = d["down_proj"]
    return out
