"""K3 operators for the independent reference, written from spec/MODEL.md §3 (not from our C++).

Every function takes torch tensors of one floating dtype (float64 for the fixtures, float32 only
to estimate what fp32 rounding alone does) and computes in that dtype. Orders of summation are
torch's, not MODEL.md's: in float64 the order changes results by ~1e-16 relative, far below any
gate, which is why this reference can be written for clarity instead of for bit-exactness.
Rows are tokens: x is [T, E]. Weights are [out][in] (y = x @ W.T). Weight dictionaries use short
keys (see k3_ref.layer_weights for the checkpoint names they come from).
"""

import torch


class Stats:
    """Facts about the synthetic model (docs/SYNTH.md); collected on the side, never affect the math."""

    def __init__(self):
        self.situ = {}           # kind -> dict(max_abs_gate, max_abs_up, n, n_gate_capped, ...)
        self.route_total = 0     # (layer, token) routings
        self.route_changed = 0   # ... whose top-k SET differs with vs without the bias
        self.route_min_margin = float("inf")  # smallest c[k-th] - c[(k+1)-th] seen
        self.route_counts = {}   # layer -> per-expert selection counts (tensor)

    def situ_record(self, kind, g, u, y, b1, b2):
        s = self.situ.setdefault(kind, dict(n=0, max_abs_gate=0.0, max_abs_up=0.0, max_abs_out=0.0,
                                            n_gate_beyond_2b1=0, n_up_beyond_b2=0))
        s["n"] += g.numel()
        s["max_abs_gate"] = max(s["max_abs_gate"], float(g.abs().max()))
        s["max_abs_up"] = max(s["max_abs_up"], float(u.abs().max()))
        s["max_abs_out"] = max(s["max_abs_out"], float(y.abs().max()))
        # |g| > 2*beta1 puts tanh(g/beta1) above 0.964: the gate cap is doing the work.
        s["n_gate_beyond_2b1"] += int((g.abs() > 2 * b1).sum())
        s["n_up_beyond_b2"] += int((u.abs() > b2).sum())


STATS = None  # set to a Stats() to collect


def linear(x, w):
    return x @ w.T


def rmsnorm(x, w, eps):
    """eps INSIDE the sqrt, mean over the last dim, gain applied elementwise."""
    inv = 1.0 / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps)
    return (w * x) * inv


def l2norm(x, eps=1e-6):
    """SUM (not mean) of squares; used on KDA q and k per head."""
    return x * (1.0 / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + eps))


def situ_glu(g, u, b1, b2, kind=None):
    """a = b1*tanh(g/b1)*sigmoid(g) (sigmoid of the UNCAPPED g); y = a * b2*tanh(u/b2)."""
    y = (b1 * torch.tanh(g / b1) * torch.sigmoid(g)) * (b2 * torch.tanh(u / b2))
    if STATS is not None and kind is not None:
        STATS.situ_record(kind, g, u, y, b1, b2)
    return y


def short_conv(x, w, hist):
    """Depthwise causal conv + SiLU. x [T, C], w [C, K] (tap K-1 multiplies the current input),
    hist [C, K-1] raw inputs oldest first (zeros at sequence start). Returns (y, new hist)."""
    T = x.shape[0]
    K = w.shape[1]
    buf = torch.cat([hist.T, x], dim=0)  # [K-1+T, C]
    acc = torch.zeros_like(x)
    for j in range(K):
        acc = acc + w[:, j] * buf[j:j + T]
    return torch.nn.functional.silu(acc), buf[T:].T.contiguous()


def kda_decay(z, A_log, dt_bias, lb, H, D):
    """z [T, H*D] (before dt_bias) -> (g, alpha) [T, H, D]; A_log indexed per HEAD."""
    u = torch.exp(A_log[:H]).reshape(1, H, 1) * (z.reshape(-1, H, D) + dt_bias.reshape(1, H, D))
    g = lb * torch.sigmoid(u)
    return g, torch.exp(g)


def kda_recurrence(q, k, v, alpha, beta, S):
    """Delta rule per head. q (already scaled), k, v, alpha [T, H, D]; beta [T, H];
    S [H, D, D] (row = key channel i, column = value channel j). Returns (o [T, H, D], S)."""
    outs = []
    for t in range(q.shape[0]):
        S = alpha[t].unsqueeze(-1) * S                                  # decay rows
        u = torch.einsum("hi,hij->hj", k[t], S)                        # read
        S = S + (k[t] * beta[t].unsqueeze(-1)).unsqueeze(-1) * (v[t] - u).unsqueeze(1)
        outs.append(torch.einsum("hi,hij->hj", q[t], S))               # from UPDATED state
    return torch.stack(outs), S


def kda(x, W, H, D, lb, eps, state=None):
    """MODEL.md §3.4. state = (S, hq, hk, hv) or None for a fresh sequence."""
    T, P = x.shape[0], H * D
    K = W["q_conv"].shape[-1]
    if state is None:
        z0 = x.new_zeros(P, K - 1)
        state = (x.new_zeros(H, D, D), z0, z0, z0)
    S, hq, hk, hv = state
    q, hq = short_conv(linear(x, W["q"]), W["q_conv"].reshape(P, K), hq)
    k, hk = short_conv(linear(x, W["k"]), W["k_conv"].reshape(P, K), hk)
    v, hv = short_conv(linear(x, W["v"]), W["v_conv"].reshape(P, K), hv)
    q = l2norm(q.reshape(T, H, D)) * (1.0 / (D ** 0.5))
    k = l2norm(k.reshape(T, H, D))
    v = v.reshape(T, H, D)
    beta = torch.sigmoid(linear(x, W["b"]))
    _, alpha = kda_decay(linear(linear(x, W["f_a"]), W["f_b"]), W["A_log"], W["dt_bias"], lb, H, D)
    o, S = kda_recurrence(q, k, v, alpha, beta, S)
    o = rmsnorm(o, W["o_norm"], eps).reshape(T, P)      # head-wise norm FIRST,
    o = o * torch.sigmoid(linear(x, W["g"]))            # then the output gate
    return linear(o, W["o"]), (S, hq, hk, hv)


def mla(x, W, H, nope, rope, vdim, eps_latent, use_gate=True):
    """MODEL.md §3.5, full causal attention over the T rows (no KV cache: prefix recompute)."""
    T = x.shape[0]
    kv_lora = W["kv_a_ln"].shape[0]
    q = linear(rmsnorm(linear(x, W["q_a"]), W["q_a_ln"], eps_latent), W["q_b"])
    q = q.reshape(T, H, nope + rope)
    c = linear(x, W["kv_a"])
    latent = rmsnorm(c[:, :kv_lora], W["kv_a_ln"], eps_latent)
    k_rope = c[:, kv_lora:]                                # shared by all heads, never rotated
    kv = linear(latent, W["kv_b"]).reshape(T, H, nope + vdim)
    k_nope, v = kv[..., :nope], kv[..., nope:]
    scores = (torch.einsum("thd,shd->hts", q[..., :nope], k_nope)
              + torch.einsum("thd,sd->hts", q[..., nope:], k_rope))
    scores = scores * (1.0 / ((nope + rope) ** 0.5))      # scale over the FULL 192 width
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    scores = scores.masked_fill(mask, float("-inf"))
    p = torch.softmax(scores, dim=-1)
    o = torch.einsum("hts,shd->thd", p, v).reshape(T, H * vdim)
    if use_gate:
        o = o * torch.sigmoid(linear(x, W["g"]))          # no norm before this gate
    return linear(o, W["o"]), dict(kv_latent=latent, k_rope=k_rope)


def topk_desc(c, k):
    """Repeated arg-max with strict '>' per row: ties go to the lower index; order = descending.
    c [T, N] -> idx [T, k] (long)."""
    c = c.clone()
    idx = []
    for _ in range(k):
        # torch.argmax returns the FIRST maximal index (documented), i.e. the lowest id on ties.
        j = torch.argmax(c, dim=-1)
        idx.append(j)
        c[torch.arange(c.shape[0]), j] = float("-inf")
    return torch.stack(idx, dim=-1)


def router(x, gate_w, bias, topk, renorm, routed_scale):
    """MODEL.md §3.6 steps 1-4. Returns (idx [T, k], weights [T, k])."""
    s = torch.sigmoid(linear(x, gate_w))
    c = s + bias
    idx = topk_desc(c, topk)
    w = torch.gather(s, 1, idx)
    if STATS is not None:
        plain = topk_desc(s, topk)
        STATS.route_total += x.shape[0]
        STATS.route_changed += int(sum(set(a.tolist()) != set(b.tolist())
                                       for a, b in zip(idx, plain)))
        if topk < c.shape[1]:
            srt = torch.sort(c, dim=-1, descending=True).values
            STATS.route_min_margin = min(STATS.route_min_margin,
                                         float((srt[:, topk - 1] - srt[:, topk]).min()))
    if renorm and topk > 1:
        w = w * (1.0 / (w.sum(dim=-1, keepdim=True) + 1e-20))
    return idx, w * routed_scale


def moe(x, W, topk, renorm, routed_scale, latent_norm, eps, b1, b2):
    """MODEL.md §3.6 (LatentMoE). W["w1"], W["w3"] [N, I, latent]; W["w2"] [N, latent, I]."""
    idx, wts = router(x, W["router"], W["bias"], topk, renorm, routed_scale)
    if STATS is not None:
        counts = torch.bincount(idx.reshape(-1), minlength=W["router"].shape[0])
        key = W.get("_layer", -1)
        STATS.route_counts[key] = STATS.route_counts.get(key, 0) + counts
    z = linear(x, W["down"])                                            # [T, latent]
    # Each selected expert runs once on the rows that chose it; Y[t, j] = expert idx[t, j] on z_t.
    Y = z.new_zeros(z.shape[0], topk, z.shape[1])
    for e in torch.unique(idx).tolist():
        t_idx, j_idx = (idx == e).nonzero(as_tuple=True)
        ze = z[t_idx]
        a = situ_glu(linear(ze, W["w1"][e]), linear(ze, W["w3"][e]), b1, b2, "routed")
        Y[t_idx, j_idx] = linear(a, W["w2"][e])
    acc = torch.zeros_like(z)
    for j in range(topk):                                               # top-k order
        acc = acc + wts[:, j:j + 1] * Y[:, j]
    if latent_norm:
        acc = rmsnorm(acc, W["norm"], eps)                              # on the AGGREGATE
    routed = linear(acc, W["up"])
    sa = situ_glu(linear(x, W["s_gate"]), linear(x, W["s_up"]), b1, b2, "shared")
    return routed + linear(sa, W["s_down"])                             # shared UNWEIGHTED


def dense_ffn(x, W, b1, b2):
    return linear(situ_glu(linear(x, W["d_gate"]), linear(x, W["d_up"]), b1, b2, "dense"),
                  W["d_down"])


def attnres(sources, norm_w, proj_w, eps):
    """Softmax over sources of <RMSNorm-without-gain(s), norm_w*proj_w>, mixing the RAW sources.
    sources: list of [T, E] (snapshots oldest first, running prefix last)."""
    f = norm_w * proj_w.reshape(-1)
    st = torch.stack(sources)                                           # [m, T, E]
    keys = st * (1.0 / torch.sqrt((st * st).mean(dim=-1, keepdim=True) + eps))
    p = torch.softmax((keys * f).sum(dim=-1), dim=0)                    # [m, T]
    return (p.unsqueeze(-1) * st).sum(dim=0)


def decoder_layer(L, h, blocks, W, cfg, is_mla, state=None):
    """MODEL.md §3.3 statement for statement. blocks: list of [T, E] snapshots (a new list is
    returned, the argument is not mutated). Returns (layer output, blocks, new attention state)."""
    eps = cfg["eps"]
    blocks = list(blocks)
    prefix = h
    if blocks:
        h = attnres(blocks + [prefix], W["ares_norm"], W["ares_proj"], eps)
    if L % cfg["attn_res_block"] == 0:
        blocks.append(prefix)
        prefix = None
    a_in = rmsnorm(h, W["ln_in"], eps)
    if is_mla:
        att, _ = mla(a_in, W, cfg["n_heads"], cfg["qk_nope"], cfg["qk_rope"], cfg["v_head"],
                     cfg["mla_eps"], cfg["mla_gate"])
        new_state = None
    else:
        att, new_state = kda(a_in, W, cfg["kda_heads"], cfg["kda_head_dim"], cfg["gate_lb"], eps,
                             state)
    prefix = att if prefix is None else prefix + att
    h = attnres(blocks + [prefix], W["mres_norm"], W["mres_proj"], eps)   # unconditional
    m_in = rmsnorm(h, W["ln_post"], eps)
    if L < cfg["first_dense"]:
        mlp = dense_ffn(m_in, W, cfg["b1"], cfg["b2"])
    else:
        mlp = moe(m_in, W, cfg["topk"], cfg["renorm"], cfg["routed_scale"], cfg["latent_norm"],
                  eps, cfg["b1"], cfg["b2"])
    return prefix + mlp, blocks, new_state
