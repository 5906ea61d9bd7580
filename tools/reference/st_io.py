"""Minimal safetensors reader/writer on numpy, plus bfloat16 helpers.

numpy has no bfloat16, so BF16 tensors are carried as uint16 arrays holding the raw bits.
Only numpy and the standard library are used, so this module (and the quantiser built on it)
can be tested on a machine without torch.
"""

import json
import os
import struct

import numpy as np

# safetensors dtype name -> numpy dtype used to carry it (BF16 as raw uint16 bits)
_NP_OF = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}


class Tensor:
    """A tensor as stored: safetensors dtype name + numpy array (BF16 as uint16 bits)."""

    __slots__ = ("dtype", "data")

    def __init__(self, dtype, data):
        if dtype not in _NP_OF:
            raise ValueError(f"unsupported dtype {dtype}")
        data = np.ascontiguousarray(data)
        want = _NP_OF[dtype]
        if data.dtype.kind != want.kind or data.dtype.itemsize != want.itemsize:
            raise ValueError(f"array dtype {data.dtype} does not carry {dtype}")
        self.dtype = dtype
        self.data = data

    @property
    def shape(self):
        return list(self.data.shape)

    def nbytes(self):
        return int(self.data.nbytes)

    def to_f32(self):
        if self.dtype == "BF16":
            return bf16_bits_to_f32(self.data)
        return self.data.astype(np.float32)

    def __repr__(self):
        return f"Tensor({self.dtype}, {self.shape})"


# ----------------------------------------------------------------------------- bf16

def f32_to_bf16_bits(x):
    """Round float32 values to bfloat16 (round to nearest, ties to even), return uint16 bits."""
    x = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    u = x.view(np.uint32).astype(np.uint64)
    lsb = (u >> 16) & 1
    r = ((u + 0x7FFF + lsb) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        r = np.where(nan, np.uint16(0x7FC0), r)
    return r


def bf16_bits_to_f32(b):
    b = np.ascontiguousarray(np.asarray(b, dtype=np.uint16))
    return (b.astype(np.uint32) << 16).view(np.float32)


def round_bf16(x):
    """float32 -> nearest bfloat16 value, returned as float32."""
    return bf16_bits_to_f32(f32_to_bf16_bits(x))


# ----------------------------------------------------------------------------- files

def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n).decode("utf-8"))
    return header, 8 + n


def load_file(path):
    """Return (dict name -> Tensor, metadata dict)."""
    header, base = read_header(path)
    meta = header.pop("__metadata__", {}) or {}
    with open(path, "rb") as f:
        blob = f.read()
    out = {}
    for name, info in header.items():
        dt = info["dtype"]
        b, e = info["data_offsets"]
        arr = np.frombuffer(blob, dtype=_NP_OF[dt], count=(e - b) // _NP_OF[dt].itemsize,
                            offset=base + b).reshape(info["shape"]).copy()
        out[name] = Tensor(dt, arr)
    return out, meta


def save_file(tensors, path, metadata=None):
    """Write dict name -> Tensor; tensors are laid out in name order, 8-byte aligned header."""
    names = sorted(tensors)
    header = {}
    off = 0
    for n in names:
        t = tensors[n]
        nb = t.nbytes()
        header[n] = {"dtype": t.dtype, "shape": t.shape, "data_offsets": [off, off + nb]}
        off += nb
    if metadata is not None:
        header = {"__metadata__": {str(k): str(v) for k, v in metadata.items()}, **header}
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for n in names:
            f.write(tensors[n].data.astype(_NP_OF[tensors[n].dtype], copy=False).tobytes())


def load_dir(d):
    """Load every tensor of a checkpoint directory (single file or sharded with index).

    Returns (tensors, info) where info = {"sharded": bool, "shards": [file names],
    "index_metadata": dict, "file_metadata": dict}.
    """
    idx = os.path.join(d, "model.safetensors.index.json")
    tensors = {}
    if os.path.exists(idx):
        with open(idx) as f:
            index = json.load(f)
        shards = sorted(set(index["weight_map"].values()))
        fmeta = {}
        for s in shards:
            t, fmeta = load_file(os.path.join(d, s))
            for k in t:
                if index["weight_map"].get(k) != s:
                    raise ValueError(f"index says {k} is in {index['weight_map'].get(k)}, found in {s}")
            tensors.update(t)
        if set(index["weight_map"]) != set(tensors):
            raise ValueError("index weight_map does not match the shard contents")
        return tensors, {"sharded": True, "shards": shards,
                         "index_metadata": index.get("metadata", {}), "file_metadata": fmeta}
    t, fmeta = load_file(os.path.join(d, "model.safetensors"))
    return t, {"sharded": False, "shards": ["model.safetensors"], "index_metadata": {},
               "file_metadata": fmeta}


def remove_weights(d):
    for f in os.listdir(d):
        if f.endswith(".safetensors") or f == "model.safetensors.index.json":
            os.remove(os.path.join(d, f))


def save_dir(tensors, d, n_shards=1, metadata=None, always_index=False):
    """Write tensors into d as one model.safetensors, or n_shards files plus an index.

    Shards are filled greedily in name order up to an even share of the bytes.
    """
    os.makedirs(d, exist_ok=True)
    remove_weights(d)
    names = sorted(tensors)
    total = sum(tensors[n].nbytes() for n in names)
    if n_shards <= 1:
        groups = [names]
        files = ["model.safetensors"]
    else:
        target = total / n_shards
        groups = [[] for _ in range(n_shards)]
        acc, g = 0, 0
        for n in names:
            if acc >= target * (g + 1) and g < n_shards - 1:
                g += 1
            groups[g].append(n)
            acc += tensors[n].nbytes()
        groups = [gr for gr in groups if gr]
        n_shards = len(groups)
        files = [f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors" for i in range(n_shards)]
    weight_map = {}
    for gr, fn in zip(groups, files):
        save_file({n: tensors[n] for n in gr}, os.path.join(d, fn), metadata)
        for n in gr:
            weight_map[n] = fn
    if n_shards > 1 or always_index:
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
                      f, indent=2)
            f.write("\n")
    return files
