"""An independent TAPA in PyTorch, written from the paper's formula, trained beside RoPE on the lab's data
(issue 52, item 5; docs/analysis-rules.md R59, H-impl).

The check: if the lab's TAPA trails RoPE because the lab implements it wrongly, a TAPA written separately from
the paper (Wang, Shen, Munos, Zhan, Tian, arXiv 2509.12635, §3) and trained on the same data with the same
architecture and settings would not trail by the same amount. Nothing here is taken from the lab's code; the
data is the lab's (`lab gen corpus`: the same token streams and splits as the lab's runs), the architecture is
the one the lab documents (DESIGN.md, `lab/src/model`):

  pre-RMSNorm decoder (ε = 1e-6), no biases, untied embedding and head, exact-erf GELU MLP, causal softmax
  attention, masked mean cross-entropy; weights N(0, 0.02²), the two residual outputs N(0, (0.02/√(2·layers))²);
  AdamW (β1, β2, ε, decoupled weight decay on matrices only), global-norm clipping, linear warm-up then half-cosine
  to min_lr_ratio·lr.

Encodings (per head of `d` dims; query position m, key position n):
  rope  — adjacent pairs (2i, 2i+1) rotated by θ_i = base^(−2i/d); score q̃·k̃/√d.
  tapa  — the paper: q, k split into amplitude (first a = round(ρd) dims) and phase (the rest, p = d − a) parts,
          score (q_A·k_A/√a) · cos(2π |m − n|^α (q_P·k_P)/√p)   (quadratic phase; ρ = 0.5, α = 0.1).
  nope  — q·k/√d.

Usage (needs torch: pip install torch; the lab's binary for the data):
  python3 scripts/tapa_torch.py --corpus chorales --granularity token --vocab 131 \
      --run rope:0.003 --run tapa:0.001 --seed 0 --out results/tapa-torch-chorales.json
Prints the test NLL per run and the TAPA − RoPE gap; --out writes them as JSON. CPU threads: --threads (2).
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    sys.exit("PyTorch is not installed: pip install torch (needed for this check only)")


def lab_examples(lab, corpus, granularity, seq_len, n, seed, split):
    """`n` examples of the lab's corpus task (`lab gen corpus`), as (input, target, mask) tensors [n, seq_len]."""
    cmd = [lab, "gen", "corpus", "--param", f"corpus={corpus}", "--param", f"granularity={granularity}",
           "--param", f"seq_len={seq_len}", "--n", str(n), "--seed", str(seed), "--split", split]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    if len(rows) != n:
        sys.exit(f"lab gen gave {len(rows)} examples, wanted {n}")
    inp = torch.tensor([r["input"] for r in rows], dtype=torch.long)
    tgt = torch.tensor([r["target"] for r in rows], dtype=torch.long)
    mask = torch.tensor([r["mask"] for r in rows], dtype=torch.float32)
    return inp, tgt, mask


def rms_norm(x, g):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * g


class Attention(nn.Module):
    """Causal attention with one of the encodings above, on q, k, v of shape [batch, heads, seq, d]."""

    def __init__(self, encoding, d, seq_len, rope_base, rho, alpha):
        super().__init__()
        self.encoding, self.d = encoding, d
        pos = torch.arange(seq_len, dtype=torch.float64)
        if encoding == "rope":
            theta = rope_base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
            ang = pos[:, None] * theta[None, :]
            self.register_buffer("cos", ang.cos().float())
            self.register_buffer("sin", ang.sin().float())
        if encoding == "tapa":
            self.a = min(max(int(round(rho * d)), 1), d - 1)
            dist = (pos[:, None] - pos[None, :]).abs()
            # |m − n|^α with 0 at m = n (0^α = 0 for α > 0).
            self.register_buffer("dist_pow", torch.where(dist > 0, dist.pow(alpha), torch.zeros_like(dist)).float())
        self.register_buffer("hidden", torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool), diagonal=1))

    def rotate(self, x):
        re, im = x[..., 0::2], x[..., 1::2]
        c, s = self.cos[: x.shape[-2]], self.sin[: x.shape[-2]]
        return torch.stack((re * c - im * s, re * s + im * c), dim=-1).flatten(-2)

    def scores(self, q, k):
        if self.encoding == "rope":
            return self.rotate(q) @ self.rotate(k).transpose(-1, -2) / math.sqrt(self.d)
        if self.encoding == "nope":
            return q @ k.transpose(-1, -2) / math.sqrt(self.d)
        a, p = self.a, self.d - self.a
        amplitude = q[..., :a] @ k[..., :a].transpose(-1, -2) / math.sqrt(a)
        phase = q[..., a:] @ k[..., a:].transpose(-1, -2) / math.sqrt(p)
        l = q.shape[-2]
        return amplitude * torch.cos(2 * math.pi * self.dist_pow[:l, :l] * phase)

    def forward(self, q, k, v):
        l = q.shape[-2]
        s = self.scores(q, k).masked_fill(self.hidden[:l, :l], -1e9)
        return torch.softmax(s, dim=-1) @ v


class Block(nn.Module):
    def __init__(self, encoding, d_model, heads, d_ff, seq_len, rope_base, rho, alpha):
        super().__init__()
        self.h = heads
        self.attn_norm = nn.Parameter(torch.ones(d_model))
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d_model, d_model, bias=False) for _ in range(4))
        self.mlp_norm = nn.Parameter(torch.ones(d_model))
        self.w_in = nn.Linear(d_model, d_ff, bias=False)
        self.w_out = nn.Linear(d_ff, d_model, bias=False)
        self.attn = Attention(encoding, d_model // heads, seq_len, rope_base, rho, alpha)

    def forward(self, x):
        b, l, d = x.shape
        y = rms_norm(x, self.attn_norm)
        split = lambda t: t.view(b, l, self.h, d // self.h).transpose(1, 2)
        o = self.attn(split(self.wq(y)), split(self.wk(y)), split(self.wv(y)))
        x = x + self.wo(o.transpose(1, 2).reshape(b, l, d))
        return x + self.w_out(F.gelu(self.w_in(rms_norm(x, self.mlp_norm))))


class Model(nn.Module):
    def __init__(self, encoding, vocab, d_model, layers, heads, d_ff, seq_len, rope_base, rho, alpha):
        super().__init__()
        self.emb = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(
            Block(encoding, d_model, heads, d_ff, seq_len, rope_base, rho, alpha) for _ in range(layers))
        self.final_norm = nn.Parameter(torch.ones(d_model))
        self.head = nn.Linear(d_model, vocab, bias=False)
        std, resid = 0.02, 0.02 / math.sqrt(2 * layers)
        for name, p in self.named_parameters():
            if p.ndim >= 2:
                nn.init.normal_(p, 0.0, resid if name.endswith(("wo.weight", "w_out.weight")) else std)

    def forward(self, tokens):
        x = self.emb(tokens)
        for blk in self.blocks:
            x = blk(x)
        return self.head(rms_norm(x, self.final_norm))


def masked_nll(logits, tgt, mask):
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), reduction="none")
    return (nll * mask.reshape(-1)).sum() / mask.sum().clamp_min(1)


def lr_at(step, a):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    progress = min((step - a.warmup) / max(a.steps - a.warmup, 1), 1.0)
    lo = a.lr * a.min_lr_ratio
    return lo + (a.lr - lo) * 0.5 * (1 + math.cos(math.pi * progress))


def train(encoding, lr, args, train_data, test_data):
    torch.manual_seed(args.seed)
    m = Model(encoding, args.vocab, args.d_model, args.layers, args.heads, args.d_ff, args.seq_len,
              args.rope_base, args.rho, args.alpha)
    decay = [p for p in m.parameters() if p.ndim >= 2]
    no_decay = [p for p in m.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8)
    sched = argparse.Namespace(lr=lr, warmup=args.warmup, steps=args.steps, min_lr_ratio=args.min_lr_ratio)
    inp, tgt, mask = train_data
    t0 = time.time()
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, sched)
        sl = slice(step * args.batch, (step + 1) * args.batch)
        loss = masked_nll(m(inp[sl]), tgt[sl], mask[sl])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), args.grad_clip)
        opt.step()
        if (step + 1) % max(args.steps // 4, 1) == 0:
            print(f"  {encoding} lr {lr}: step {step + 1}/{args.steps} train loss {loss.item():.4f} "
                  f"({time.time() - t0:.0f} s)", file=sys.stderr)
    m.eval()
    with torch.no_grad():
        ti, tt, tm = test_data
        total, count = 0.0, 0.0
        for s in range(0, ti.shape[0], args.batch):
            logits = m(ti[s:s + args.batch])
            nll = F.cross_entropy(logits.reshape(-1, args.vocab), tt[s:s + args.batch].reshape(-1), reduction="none")
            total += (nll * tm[s:s + args.batch].reshape(-1)).sum().item()
            count += tm[s:s + args.batch].sum().item()
    return {"encoding": encoding, "lr": lr, "test_nll": total / count, "train_loss": loss.item(),
            "wall_s": time.time() - t0}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lab", default=os.environ.get("LAB", "target/release/lab"), help="the lab's binary (data)")
    ap.add_argument("--corpus", default="chorales")
    ap.add_argument("--granularity", default="token")
    ap.add_argument("--vocab", type=int, default=131)
    ap.add_argument("--run", action="append", default=[],
                    help="ENCODING:LR (rope, tapa, nope), repeatable; default rope:0.003 and tapa:0.001")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--d-ff", type=int, default=256)
    ap.add_argument("--rope-base", type=float, default=10000.0)
    ap.add_argument("--rho", type=float, default=0.5)
    ap.add_argument("--alpha", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--test-n", type=int, default=512, help="test sequences (the lab's eval split)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args()
    runs = args.run or ["rope:0.003", "tapa:0.001"]
    parsed = []
    for r in runs:
        enc, _, lr = r.partition(":")
        if enc not in ("rope", "tapa", "nope") or not lr:
            sys.exit(f"--run {r}: expected ENCODING:LR with ENCODING rope, tapa or nope")
        parsed.append((enc, float(lr)))
    torch.set_num_threads(args.threads)
    train_data = lab_examples(args.lab, args.corpus, args.granularity, args.seq_len, args.steps * args.batch,
                              args.seed, "train")
    test_data = lab_examples(args.lab, args.corpus, args.granularity, args.seq_len, args.test_n, 0, "eval")
    results = []
    for enc, lr in parsed:
        r = train(enc, lr, args, train_data, test_data)
        print(f"{args.corpus} {enc} lr {lr}: test NLL {r['test_nll']:.4f} ({r['wall_s']:.0f} s)")
        results.append(r)
    by = {r["encoding"]: r["test_nll"] for r in results}
    if "rope" in by and "tapa" in by:
        gap = by["tapa"] - by["rope"]
        print(f"{args.corpus}: tapa − rope = {gap:+.4f} nats ({100 * gap / by['rope']:+.1f} %)")
    if args.out:
        with open(args.out + ".tmp", "w") as f:
            json.dump({"args": vars(args), "torch": torch.__version__, "results": results}, f, indent=1)
        os.replace(args.out + ".tmp", args.out)


if __name__ == "__main__":
    main()
