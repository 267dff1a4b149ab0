"""PyTorch eager baseline of the lab's training step (issue 4, docs/performance.md).

Rebuilds the model that `lab bench train-step` describes (its JSON output: d_model, n_layers, n_heads, d_ff,
seq_len, batch, vocab, RoPE base and pair layout, AdamW settings) in PyTorch, and times the same training step
on the CPU with the same number of threads:

  pre-RMSNorm decoder, no biases, untied embedding/head, GELU MLP, RoPE on adjacent pairs (2i, 2i+1),
  causal softmax attention, masked cross-entropy, global-norm gradient clipping, AdamW(β1, β2, ε) with
  weight decay on matrices only.

Attention is timed two ways: `manual` (q·kᵀ, mask, softmax, ·v: the same reference computation as the lab's)
and `sdpa` (torch.nn.functional.scaled_dot_product_attention, PyTorch's fused CPU kernel).

Usage:
  lab bench train-step --preset quick --threads 2 > lab.json
  python3 bench/torch_baseline.py --shape lab.json [--steps 30] [--warmup 5]
  # on an NVIDIA machine (bench/gpu.sh): lab built with --features cuda
  lab bench train-step --preset quick --backend cuda > lab-cuda.json
  python3 bench/torch_baseline.py --shape lab-cuda.json --device cuda --profile-steps 3
Prints one JSON object per attention kind and the lab/PyTorch ratio; with --profile-steps, also what a step
launches (the lab's side: `lab bench train-step --profile-steps`). PyTorch is needed for this benchmark only
(pip install torch); the tests do not use it.
"""

import argparse
import json
import statistics
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    sys.exit("PyTorch is not installed: pip install torch (needed for this benchmark only)")


def rms_norm(x, g):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * g


class Block(nn.Module):
    def __init__(self, d, h, dff, attention):
        super().__init__()
        self.h, self.attention = h, attention
        self.attn_norm = nn.Parameter(torch.ones(d))
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.mlp_norm = nn.Parameter(torch.ones(d))
        self.w_in = nn.Linear(d, dff, bias=False)
        self.w_out = nn.Linear(dff, d, bias=False)

    def rope(self, x, cos, sin):
        b, h, l, d = x.shape
        pairs = x.view(b, h, l, d // 2, 2)
        re, im = pairs[..., 0], pairs[..., 1]
        return torch.stack((re * cos - im * sin, re * sin + im * cos), dim=-1).view(b, h, l, d)

    def forward(self, x, cos, sin, mask):
        b, l, d = x.shape
        hd = d // self.h
        y = rms_norm(x, self.attn_norm)
        split = lambda t: t.view(b, l, self.h, hd).transpose(1, 2)
        q, k, v = split(self.wq(y)), split(self.wk(y)), split(self.wv(y))
        q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
        if self.attention == "sdpa":
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            s = (q @ k.transpose(-1, -2)) / hd**0.5
            o = torch.softmax(s.masked_fill(mask, -1e9), dim=-1) @ v
        x = x + self.wo(o.transpose(1, 2).reshape(b, l, d))
        return x + self.w_out(F.gelu(self.w_in(rms_norm(x, self.mlp_norm))))


class Model(nn.Module):
    def __init__(self, s, attention):
        super().__init__()
        d = s["d_model"]
        self.emb = nn.Embedding(s["vocab"], d)
        self.blocks = nn.ModuleList(Block(d, s["n_heads"], s["d_ff"], attention) for _ in range(s["n_layers"]))
        self.final_norm = nn.Parameter(torch.ones(d))
        self.head = nn.Linear(d, s["vocab"], bias=False)
        hd = d // s["n_heads"]
        inv = s["rope_base"] ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        ang = torch.arange(s["seq_len"], dtype=torch.float64)[:, None] * inv[None, :]
        self.register_buffer("cos", ang.cos().float())
        self.register_buffer("sin", ang.sin().float())
        l = s["seq_len"]
        self.register_buffer("mask", torch.triu(torch.ones(l, l, dtype=torch.bool), diagonal=1))

    def forward(self, tokens):
        x = self.emb(tokens)
        for blk in self.blocks:
            x = blk(x, self.cos, self.sin, self.mask)
        return self.head(rms_norm(x, self.final_norm))


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# aten operations that only make views or metadata: no kernel runs for them on a GPU.
NO_KERNEL = {
    "aten::view", "aten::_unsafe_view", "aten::reshape", "aten::as_strided", "aten::t", "aten::transpose",
    "aten::expand", "aten::permute", "aten::squeeze", "aten::unsqueeze", "aten::select", "aten::slice",
    "aten::detach", "aten::detach_", "aten::alias", "aten::resolve_conj", "aten::resolve_neg", "aten::empty",
    "aten::empty_like", "aten::empty_strided", "aten::unbind", "aten::split", "aten::chunk", "aten::flatten",
    "aten::lift_fresh", "aten::numpy_T", "aten::_reshape_alias", "aten::contiguous", "aten::item",
    "aten::_local_scalar_dense", "aten::is_nonzero", "aten::result_type", "aten::to", "aten::_to_copy",
}


def profile_counts(prof, n, device):
    """What `n` profiled steps launched: on CUDA the device's kernels, copies and fills (their count
    and summed device time per step, from the profiler's device events); on the CPU the aten operations
    that compute (leaf aten events, views and metadata left out: NO_KERNEL), the proxy for what an eager
    GPU step would launch."""
    from torch.autograd import DeviceType
    events = prof.events()
    out = {"profile_steps": n}
    if device.type == "cuda":
        gpu = [e for e in events if e.device_type == DeviceType.CUDA]
        if gpu:
            out["kernels_per_step"] = len(gpu) / n
            out["device_ms_per_step"] = sum(e.time_range.elapsed_us() for e in gpu) / 1e3 / n
        else:  # older profilers attach the kernels to the CPU events that launched them
            ks = [k for e in events for k in getattr(e, "kernels", [])]
            out["kernels_per_step"] = len(ks) / n
            out["device_ms_per_step"] = sum(k.duration for k in ks) / 1e3 / n
        names = {}
        for e in gpu:
            names[e.name] = names.get(e.name, 0) + 1
        out["kernel_kinds"] = [{"kernel": k[:80], "per_step": c / n}
                               for k, c in sorted(names.items(), key=lambda kv: -kv[1])[:25]]
    leaf = [e for e in events if e.device_type == DeviceType.CPU and e.name.startswith("aten::")
            and e.name not in NO_KERNEL
            and not any(c.name.startswith("aten::") and c.name not in NO_KERNEL for c in e.cpu_children)]
    out["aten_compute_ops_per_step"] = len(leaf) / n
    return out


def bench(s, attention, steps, warmup, device, profile_steps=0):
    torch.manual_seed(0)
    model = Model(s, attention).to(device)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": s["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
        lr=s["lr"], betas=(s["beta1"], s["beta2"]), eps=s["adam_eps"])
    b, l, v = s["batch"], s["seq_len"], s["vocab"]
    g = torch.Generator().manual_seed(1)
    data = [(torch.randint(0, v, (b, l), generator=g), torch.randint(0, v, (b, l), generator=g),
             (torch.rand(b, l, generator=g) > 0.1).float()) for _ in range(warmup + steps + profile_steps)]
    data = [tuple(t.to(device) for t in batch) for batch in data]

    def step(inp, tgt, mask):
        logits = model(inp)
        nll = F.cross_entropy(logits.view(-1, v), tgt.view(-1), reduction="none")
        loss = (nll * mask.view(-1)).sum() / mask.sum().clamp_min(1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), s["grad_clip"])
        opt.step()
        # The lab reads the loss and the gradient norm back every step; so does this loop.
        loss.item()

    times = []
    for i, batch in enumerate(data[:warmup + steps]):
        sync(device)
        t0 = time.perf_counter()
        step(*batch)
        sync(device)
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    ms = statistics.median(times)
    out = {"framework": "pytorch", "torch": torch.__version__, "attention": attention, "threads": torch.get_num_threads(),
           "device": str(device),
           "ms_per_step": ms, "tokens_per_s": b * l / (ms / 1e3), "steps": steps}
    if profile_steps > 0:
        # After the timing, so that a profiler failure costs only these fields.
        try:
            from torch.profiler import profile, ProfilerActivity
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
            sync(device)
            with profile(activities=acts) as prof:
                for batch in data[warmup + steps:]:
                    step(*batch)
                sync(device)
            out.update(profile_counts(prof, profile_steps, device))
        except Exception as e:  # noqa: BLE001 - report, keep the timing
            out["profile_error"] = f"{type(e).__name__}: {e}"
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", required=True, help="JSON printed by `lab bench train-step`")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda (bench/gpu.sh)")
    ap.add_argument("--profile-steps", type=int, default=0,
                    help="this many more steps under torch.profiler after the timing: kernels_per_step and "
                         "device_ms_per_step on CUDA, aten_compute_ops_per_step everywhere (default 0: off)")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: this PyTorch build sees no CUDA device")
    with open(args.shape) as f:
        s = json.load(f)
    if s.get("encoding") != "rope" or s.get("pair_layout") != "adjacent":
        sys.exit("this baseline implements RoPE with adjacent pairs only")
    torch.set_num_threads(int(s["threads"]))
    for attention in ("manual", "sdpa"):
        r = bench(s, attention, args.steps, args.warmup, device, max(0, args.profile_steps))
        r["lab_ms_per_step"] = s["ms_per_step"]
        r["lab_over_pytorch"] = s["ms_per_step"] / r["ms_per_step"]
        print(json.dumps(r))


if __name__ == "__main__":
    main()
