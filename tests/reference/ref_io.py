"""Checkpoint reading for the independent K3 reference (tests/reference/k3_ref.py).

Goals: read a released-layout checkpoint (safetensors shards + config.json) with nothing but the
standard library and numpy, so the reference shares no code with the C++ engine or its formats/
module. Written from spec/MODEL.md §1, §2, §4 only.
Non-goals: validating every safetensors rule (k3verify does that); streaming (tiny and small
checkpoints fit in RAM); the flat fixture config shape beyond what §1.2's lookup gives for free.
Errors raise RefError naming the file, the tensor and the rule broken.
"""

import json
import os
import struct

import numpy as np


class RefError(Exception):
    pass


# ---- safetensors -----------------------------------------------------------------------------

_DTYPES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "U8": 1}


def _read_header(path):
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise RefError(f"{path}: shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", raw)
        size = os.fstat(f.fileno()).st_size
        if n > size - 8:
            raise RefError(f"{path}: header length {n} exceeds file size {size}")
        header = json.loads(f.read(n))
    return header, 8 + n, size


class SafetensorsFile:
    """One shard; tensors are read lazily through a numpy memmap of the data section."""

    def __init__(self, path):
        self.path = path
        header, self.data_start, size = _read_header(path)
        header.pop("__metadata__", None)
        self.tensors = {}
        for name, info in header.items():
            dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
            if dtype not in _DTYPES:
                raise RefError(f"{path}: tensor {name}: unsupported dtype {dtype}")
            want = int(np.prod(shape, dtype=np.int64)) * _DTYPES[dtype]
            if end - begin != want or self.data_start + end > size:
                raise RefError(f"{path}: tensor {name}: data_offsets [{begin},{end}) do not hold "
                               f"{want} bytes of {dtype}{shape} inside the {size}-byte file")
            self.tensors[name] = (dtype, tuple(shape), begin, end)
        self._map = np.memmap(path, dtype=np.uint8, mode="r")

    def raw(self, name):
        dtype, shape, begin, end = self.tensors[name]
        return dtype, shape, self._map[self.data_start + begin:self.data_start + end]


def to_float64(dtype, shape, raw, where):
    """Widen BF16/F16/F32/F64 bytes to float64 (exact for every one of them)."""
    if dtype == "BF16":
        bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        arr = bits.view(np.float32)
    elif dtype == "F16":
        arr = np.frombuffer(raw, dtype="<f2")
    elif dtype == "F32":
        arr = np.frombuffer(raw, dtype="<f4")
    elif dtype == "F64":
        arr = np.frombuffer(raw, dtype="<f8")
    else:
        raise RefError(f"{where}: dtype {dtype} is not a float type")
    return arr.astype(np.float64).reshape(shape)


# ---- MXFP4 (MODEL.md §4) ----------------------------------------------------------------------

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                 -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float64)


def dequant_mxfp4(packed, scales, where):
    """packed [rows][cols/2] U8 (low nibble = EVEN element), scales [rows][cols/32] E8M0."""
    rows, half = packed.shape
    cols = half * 2
    if scales.shape != (rows, cols // 32) or cols % 32:
        raise RefError(f"{where}: scale shape {scales.shape} does not match packed {packed.shape} "
                       f"(rule: scale_cols*32 == 2*packed_cols, same rows)")
    vals = np.empty((rows, cols), dtype=np.float64)
    vals[:, 0::2] = E2M1[packed & 0x0F]
    vals[:, 1::2] = E2M1[packed >> 4]
    s = scales.astype(np.int64)
    mult = np.where(s == 255, 0.0, np.ldexp(1.0, (s - 127).astype(np.int32)))
    return vals * np.repeat(mult, 32, axis=1)


# ---- checkpoint directory ---------------------------------------------------------------------

class Checkpoint:
    """All *.safetensors shards of a directory, addressed by tensor name."""

    def __init__(self, directory):
        self.dir = directory
        names = sorted(n for n in os.listdir(directory) if n.endswith(".safetensors"))
        if not names:
            raise RefError(f"{directory}: no *.safetensors shards")
        self.where = {}
        for n in names:
            shard = SafetensorsFile(os.path.join(directory, n))
            for t in shard.tensors:
                if t in self.where:
                    raise RefError(f"{directory}: tensor {t} appears in two shards")
                self.where[t] = shard

    def has(self, name):
        return name in self.where

    def float64(self, name, shape=None):
        if name not in self.where:
            raise RefError(f"{self.dir}: tensor {name} missing")
        shard = self.where[name]
        dtype, sh, raw = shard.raw(name)
        arr = to_float64(dtype, sh, raw, f"{shard.path}: {name}")
        if shape is not None:
            if arr.size != int(np.prod(shape)):
                raise RefError(f"{shard.path}: tensor {name}: {arr.size} elements, config wants "
                               f"{shape}")
            arr = arr.reshape(shape)
        return arr

    def mxfp4(self, base, rows, cols):
        """Dequantised [rows][cols] from BASE.weight_packed / BASE.weight_scale."""
        where = f"{self.dir}: {base}"
        out = []
        for suffix in ("weight_packed", "weight_scale"):
            name = f"{base}.{suffix}"
            if name not in self.where:
                raise RefError(f"{where}: tensor {name} missing")
            dtype, shape, raw = self.where[name].raw(name)
            if dtype != "U8" or len(shape) != 2:
                raise RefError(f"{where}.{suffix}: want U8 rank 2, got {dtype}{list(shape)}")
            out.append(np.asarray(raw).reshape(shape))
        packed, scales = out
        if packed.shape != (rows, cols // 2):
            raise RefError(f"{where}.weight_packed: shape {packed.shape}, config wants "
                           f"({rows}, {cols // 2})")
        return dequant_mxfp4(packed, scales, where)


# ---- config.json (MODEL.md §1.2, minimally) ---------------------------------------------------

# engine field -> (primary key, alias)
_FIELDS = {
    "hidden": ("hidden_size", None), "n_layers": ("num_hidden_layers", None),
    "vocab": ("vocab_size", None), "eps": ("rms_norm_eps", None),
    "kda_heads": ("num_heads", "kda_num_heads"), "kda_head_dim": ("head_dim", "kda_head_dim"),
    "conv_k": ("short_conv_kernel_size", None), "gate_lb": ("gate_lower_bound", None),
    "n_heads": ("num_attention_heads", None), "q_lora": ("q_lora_rank", None),
    "kv_lora": ("kv_lora_rank", None), "qk_nope": ("qk_nope_head_dim", None),
    "qk_rope": ("qk_rope_head_dim", None), "v_head": ("v_head_dim", None),
    "n_experts": ("num_experts", None), "topk": ("num_experts_per_token", None),
    "n_shared": ("num_shared_experts", None), "latent": ("routed_expert_hidden_size", None),
    "moe_inter": ("moe_intermediate_size", None), "routed_scale": ("routed_scaling_factor", None),
    "first_dense": ("first_k_dense_replace", None), "dense_inter": ("intermediate_size", None),
    "attn_res_block": ("attn_res_block_size", None),
    "b1": ("activation_situ_beta", "situ_beta"), "b2": ("activation_situ_linear_beta",
                                                       "situ_linear_beta"),
}
_FLOAT_FIELDS = {"eps", "gate_lb", "routed_scale", "b1", "b2"}
_OPTIONAL_BOOLS = {"mla_gate": "mla_use_output_gate", "renorm": "moe_renormalize",
                   "latent_norm": "latent_moe_use_norm"}


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def parse_config(root, where="config.json"):
    nested = "text_config" in root
    text = root.get("text_config") if nested else None
    lin = (text or {}).get("linear_attn_config") if nested else root.get("linear_attn_config")
    objects = [o for o in (text, lin, root) if isinstance(o, dict)]

    def lookup(primary, alias):
        for obj in objects:
            for key in (primary, alias):
                if key is not None and key in obj:
                    return obj[key]
        return None

    cfg, missing = {}, []
    for field, (primary, alias) in _FIELDS.items():
        v = lookup(primary, alias)
        if not _is_number(v):
            missing.append(primary)
            continue
        cfg[field] = float(v) if field in _FLOAT_FIELDS else int(v)
    for field, key in _OPTIONAL_BOOLS.items():
        v = lookup(key, None)
        cfg[field] = bool(v) if isinstance(v, (bool, int, float)) else True
    fal = lookup("full_attn_layers", None)
    if not isinstance(fal, list) or not fal or not all(_is_number(x) for x in fal):
        missing.append("full_attn_layers")
    if missing:
        raise RefError(f"{where}: missing or non-numeric keys: {', '.join(missing)}")
    cfg["full_attn"] = [int(x) for x in fal]
    n = cfg["n_layers"]
    if any(not 1 <= x <= n for x in cfg["full_attn"]) or len(cfg["full_attn"]) >= n:
        raise RefError(f"{where}: full_attn_layers {cfg['full_attn']} not a one-based proper "
                       f"subset of 1..{n}")
    if not 1 <= cfg["topk"] <= min(64, cfg["n_experts"]):
        raise RefError(f"{where}: num_experts_per_token {cfg['topk']} outside 1..min(64, "
                       f"num_experts)")
    cfg["mla_eps"] = 1e-6  # upstream default for q_a_layernorm / kv_a_layernorm (MODEL.md head)
    return cfg


def load_config(directory):
    path = os.path.join(directory, "config.json")
    with open(path, "rb") as f:
        return parse_config(json.load(f), path)
