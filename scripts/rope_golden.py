"""Golden vectors for the RoPE scaling registry (lab/src/model/scaling.rs).

Written independently of the Rust code, in NumPy float64, following the definitions of Hugging Face
transformers' modeling_rope_utils (default, linear, dynamic, yarn, llama3) and the NTK-aware base change
b·s^(d/(d−2)). Output: lab/tests/data/rope_golden.json (committed). Re-run with
    python3 scripts/rope_golden.py > lab/tests/data/rope_golden.json
"""

import json
import math

import numpy as np


def default(d, base):
    return 1.0 / (base ** (np.arange(0, d, 2, dtype=np.float64) / d))


def linear(d, base, s):
    return default(d, base) / s, 1.0


def ntk(d, base, s):
    return default(d, base * s ** (d / (d - 2))), 1.0


def dynamic(d, base, s, l0, seq_len):
    seq_len = max(seq_len, l0)
    new_base = base * ((s * seq_len / l0) - (s - 1)) ** (d / (d - 2))
    return default(d, new_base), 1.0


def yarn(d, base, s, l0, beta_fast=32.0, beta_slow=1.0, truncate=True):
    def corr_dim(rot):
        return (d * math.log(l0 / (rot * 2 * math.pi))) / (2 * math.log(base))

    low, high = corr_dim(beta_fast), corr_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extra_factor = 1 - ramp
    pos = base ** (np.arange(0, d, 2, dtype=np.float64) / d)
    inv = (1.0 / (s * pos)) * (1 - extra_factor) + (1.0 / pos) * extra_factor
    mscale = 1.0 if s <= 1 else 0.1 * math.log(s) + 1.0
    return inv, mscale


def llama3(d, base, s, l0, low_ff=1.0, high_ff=4.0):
    inv = default(d, base)
    low_wl, high_wl = l0 / low_ff, l0 / high_ff
    wl = 2 * math.pi / inv
    out = np.where(wl > low_wl, inv / s, inv)
    smooth = (l0 / wl - low_ff) / (high_ff - low_ff)
    smoothed = (1 - smooth) * out / s + smooth * out
    medium = ~(wl < high_wl) & ~(wl > low_wl)
    return np.where(medium, smoothed, out), 1.0


CASES = [
    dict(kind="none", head_dim=64, base=10000.0),
    dict(kind="linear", head_dim=64, base=10000.0, factor=4.0),
    dict(kind="ntk", head_dim=128, base=10000.0, factor=8.0),
    dict(kind="dynamic", head_dim=64, base=10000.0, factor=2.0, original_max_len=2048, seq_len=8192),
    dict(kind="yarn", head_dim=128, base=10000.0, factor=8.0, original_max_len=4096),
    dict(kind="yarn", head_dim=64, base=500000.0, factor=4.0, original_max_len=8192, truncate=False),
    dict(kind="yarn", head_dim=32, base=10000.0, factor=16.0, original_max_len=128, beta_fast=16.0, beta_slow=2.0),
    dict(kind="llama3", head_dim=128, base=500000.0, factor=8.0, original_max_len=8192),
    dict(kind="llama3", head_dim=64, base=10000.0, factor=4.0, original_max_len=256, low_freq_factor=2.0, high_freq_factor=8.0),
]


def compute(c):
    d, b = c["head_dim"], c["base"]
    k = c["kind"]
    if k == "none":
        return default(d, b), 1.0
    if k == "linear":
        return linear(d, b, c["factor"])
    if k == "ntk":
        return ntk(d, b, c["factor"])
    if k == "dynamic":
        return dynamic(d, b, c["factor"], c["original_max_len"], c["seq_len"])
    if k == "yarn":
        return yarn(d, b, c["factor"], c["original_max_len"], c.get("beta_fast", 32.0),
                    c.get("beta_slow", 1.0), c.get("truncate", True))
    if k == "llama3":
        return llama3(d, b, c["factor"], c["original_max_len"], c.get("low_freq_factor", 1.0),
                      c.get("high_freq_factor", 4.0))
    raise ValueError(k)


out = []
for c in CASES:
    inv, att = compute(c)
    out.append(dict(case=c, inv_freq=[float(x) for x in inv], attention_factor=float(att)))
print(json.dumps(out, indent=1))
