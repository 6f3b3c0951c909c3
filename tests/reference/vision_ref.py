#!/usr/bin/python3
"""Float64 reference of Kimi K3's vision tower (MoonViT-V2) and patchmergerv2 projector.

Goals: the math of spec/VISION-AND-TOOLS.md "Vision tower" in float64 torch, written from the spec
(and the facts it cites from the public ports), sharing no code with the C++ (k3run/vision/):
torch's own F.interpolate (bilinear, align_corners=False), complex RoPE, full softmax attention
(no tiling), F.gelu. Used by tests/k3run/vision/vision_tower_test.cpp through files.
Non-goals: video (t > 1), several images per call, preprocessing (the patches are given).

Usage: vision_ref.py DIR
  DIR/weights.safetensors  the released tensor names (vision_tower.*, mm_projector.*), BF16/F32;
                           or, when cases.json has "checkpoint": PATH, the shards of that
                           checkpoint directory (a `k3prep synth` or released checkpoint)
  DIR/cases.json           {"dims": {hidden, heads, head_dim, mlp, layers, pos_h, pos_w, patch,
                            text_hidden, norm_eps, projector_eps, rope_theta},
                            "cases": [{"gh", "gw", "patches": "FILE"}]}; FILE holds gh*gw*3*patch²
                            little-endian float32 patches, (gh, gw) row-major, each (c, y, x)
Writes DIR/out_<i>.bin: (gh/2)*(gw/2)*text_hidden little-endian float64 rows per case.
"""

import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ref_io import Checkpoint, SafetensorsFile, to_float64  # noqa: E402


class CheckpointTensors:
    """raw(name) over every shard of a checkpoint directory (ref_io.Checkpoint's index)."""

    def __init__(self, directory):
        self.ck = Checkpoint(directory)

    def raw(self, name):
        if not self.ck.has(name):
            sys.exit(f"{self.ck.dir}: tensor {name} missing")
        return self.ck.where[name].raw(name)


def load(st, name):
    dtype, shape, raw = st.raw(name)
    return torch.from_numpy(to_float64(dtype, shape, raw, name).copy())


def rms_norm(x, w, eps):
    # torch.nn.RMSNorm: x * rsqrt(mean(x^2) + eps) * weight
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_cis(dims, gh, gw):
    """(gh*gw, d/2) complex: entry 2i = cis(col * f_i), 2i+1 = cis(row * f_i), f_i = theta^(-4i/d)."""
    d = dims["head_dim"]
    freqs = 1.0 / (dims["rope_theta"] ** (torch.arange(0, d, 4, dtype=torch.float64)[: d // 4] / d))
    rows = torch.arange(gh, dtype=torch.float64).repeat_interleave(gw)  # row of patch p
    cols = torch.arange(gw, dtype=torch.float64).repeat(gh)             # column of patch p
    x_cis = torch.polar(torch.ones(gh * gw, d // 4, dtype=torch.float64), torch.outer(cols, freqs))
    y_cis = torch.polar(torch.ones(gh * gw, d // 4, dtype=torch.float64), torch.outer(rows, freqs))
    return torch.stack([x_cis, y_cis], dim=-1).reshape(gh * gw, d // 2)


def apply_rope(t, cis):
    """t: (L, heads, d) float64; pairs (2j, 2j+1) as complex numbers times cis (L, d/2)."""
    c = torch.view_as_complex(t.reshape(*t.shape[:-1], -1, 2).contiguous())
    out = torch.view_as_real(c * cis[:, None, :])
    return out.reshape(t.shape)


def tower(st, dims, patches, gh, gw):
    H, heads, d = dims["hidden"], dims["heads"], dims["head_dim"]
    n = gh * gw
    pre = "vision_tower."
    # Patch embed: Conv2d(3, H, k=patch, stride=patch, bias=False) on each [3, p, p] patch.
    w_pe = load(st, pre + "patch_embed.proj.weight")  # [H, 3, p, p]
    x = F.conv2d(patches, w_pe).reshape(n, H)
    pos = load(st, pre + "patch_embed.pos_emb.weight")  # [pos_h, pos_w, H]
    if (gh, gw) == tuple(pos.shape[:2]):
        pe = pos.reshape(-1, H)
    else:
        pe = F.interpolate(pos.permute(2, 0, 1).unsqueeze(0), size=(gh, gw), mode="bilinear",
                           align_corners=False).squeeze(0).permute(1, 2, 0).reshape(-1, H)
    x = x + pe
    cis = rope_cis(dims, gh, gw)
    for layer in range(dims["layers"]):
        b = f"{pre}encoder.blocks.{layer}."
        h = rms_norm(x, load(st, b + "norm0.weight"), dims["norm_eps"])
        qkv = (h @ load(st, b + "wqkv.weight").T).reshape(n, 3, heads, d)
        q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
        q, k = apply_rope(q, cis), apply_rope(k, cis)
        scores = torch.einsum("qhd,khd->hqk", q, k) * (d ** -0.5)  # bidirectional, one image
        o = torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v).reshape(n, heads * d)
        x = x + o @ load(st, b + "wo.weight").T
        h = rms_norm(x, load(st, b + "norm1.weight"), dims["norm_eps"])
        h = F.gelu(h @ load(st, b + "mlp.fc0.weight").T, approximate="tanh")
        x = x + h @ load(st, b + "mlp.fc1.weight").T
    x = rms_norm(x, load(st, pre + "encoder.final_layernorm.weight"), dims["norm_eps"])
    # sd2_tpool with t = 1: view(1, gh/2, 2, gw/2, 2, H).permute(0, 1, 3, 2, 4, 5), mean over t.
    m = x.view(1, gh // 2, 2, gw // 2, 2, H).permute(0, 1, 3, 2, 4, 5).mean(dim=0)
    m = m.reshape((gh // 2) * (gw // 2), 4 * H)
    m = F.gelu(m @ load(st, "mm_projector.proj.0.weight").T)  # exact erf GELU
    m = m @ load(st, "mm_projector.proj.2.weight").T
    return rms_norm(m, load(st, "mm_projector.post_norm.weight"), dims["projector_eps"])


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: vision_ref.py DIR")
    torch.set_num_threads(1)
    out_dir = sys.argv[1]
    spec = json.load(open(os.path.join(out_dir, "cases.json")))
    dims = spec["dims"]
    if "checkpoint" in spec:
        st = CheckpointTensors(spec["checkpoint"])
    else:
        st = SafetensorsFile(os.path.join(out_dir, "weights.safetensors"))
    p = dims["patch"]
    for i, case in enumerate(spec["cases"]):
        gh, gw = case["gh"], case["gw"]
        raw = np.fromfile(os.path.join(out_dir, case["patches"]), dtype="<f4")
        if raw.size != gh * gw * 3 * p * p:
            sys.exit(f"case {i}: {raw.size} floats, expected {gh * gw * 3 * p * p}")
        patches = torch.from_numpy(raw.astype(np.float64)).reshape(gh * gw, 3, p, p)
        with torch.no_grad():
            out = tower(st, dims, patches, gh, gw)
        out.numpy().astype("<f8").tofile(os.path.join(out_dir, f"out_{i}.bin"))
        print(f"case {i}: {gh}x{gw} patches -> {out.shape[0]} rows, rms {out.pow(2).mean().sqrt():.4g}")


if __name__ == "__main__":
    main()
