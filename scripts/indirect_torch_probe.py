"""An independent PyTorch check of indirect indexing at a small rung (issue 18; docs/analysis-rules.md R24).

Trains bench/torch_baseline.py's model (the lab's transformer rebuilt in PyTorch eager: pre-RMSNorm, no
biases, untied head, GELU MLP, RoPE on adjacent pairs, AdamW with decay on matrices, global-norm clipping)
on examples printed by `lab gen indirect` (fresh training examples every step, from the train split; held-out
examples from the eval split), with the lab's schedule (linear warm-up, then cosine to `min_lr_ratio · lr`),
and prints held-out accuracy at the target split by shift (k = 0: copy the query letter; k != 0: find it,
then move), so a plateau of the lab's runs can be told from a defect of the lab.

Usage (PyTorch needed: pip install torch):
  python3 scripts/indirect_torch_probe.py --lab target/release/lab --min-letters 5 --max-letters 8 \
      --max-shift 2 --seq-len 16 --steps 6000 [--d-model 64 --n-heads 2 --d-ff 256 --threads 1]
Prints one JSON line per evaluation.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    sys.exit("PyTorch is not installed: pip install torch (needed for this probe only)")

from torch_baseline import Model  # noqa: E402


def examples(lab, args, split, n, seed):
    cmd = [lab, "gen", "indirect", "--n", str(n), "--seed", str(seed), "--split", split,
           "--param", f"min_letters={args.min_letters}", "--param", f"max_letters={args.max_letters}",
           "--param", f"max_shift={args.max_shift}", "--param", f"seq_len={args.seq_len}"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    inp = torch.tensor([r["input"] for r in rows])
    tgt = torch.tensor([r["target"] for r in rows])
    mask = torch.tensor([r["mask"] for r in rows])
    shift = torch.tensor([r["shift"] for r in rows])
    return inp, tgt, mask, shift


def accuracy_by_shift(model, data):
    inp, tgt, mask, shift = data
    with torch.no_grad():
        pred = model(inp).argmax(-1)
    pos = mask.float().argmax(-1)
    idx = torch.arange(len(inp))
    right = (pred[idx, pos] == tgt[idx, pos]).float()
    out = {"accuracy": right.mean().item()}
    out["acc_shift0"] = right[shift == 0].mean().item()
    out["acc_shift_nonzero"] = right[shift != 0].mean().item()
    for a in sorted(set(shift.abs().tolist())):
        out[f"acc_abs_shift_{a}"] = right[shift.abs() == a].mean().item()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lab", default="target/release/lab")
    ap.add_argument("--min-letters", type=int, default=5)
    ap.add_argument("--max-letters", type=int, default=8)
    ap.add_argument("--max-shift", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=16)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--n-layers", type=int, default=2)
    ap.add_argument("--n-heads", type=int, default=2)
    ap.add_argument("--d-ff", type=int, default=256)
    ap.add_argument("--steps", type=int, default=6000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.002)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--eval-n", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    s = {"vocab": 65, "d_model": args.d_model, "n_layers": args.n_layers, "n_heads": args.n_heads,
         "d_ff": args.d_ff, "rope_base": 10000.0, "seq_len": args.seq_len}
    model = Model(s, "manual")
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    held_out = examples(args.lab, args, "eval", args.eval_n, args.seed)
    chunk = 200 * args.batch
    train, used = None, chunk
    t0 = time.time()
    for step in range(1, args.steps + 1):
        if used >= chunk:
            train = examples(args.lab, args, "train", chunk, args.seed * 1_000_003 + step)
            used = 0
        inp, tgt, mask, _ = (t[used:used + args.batch] for t in train)
        used += args.batch
        if step <= args.warmup:
            lr = args.lr * step / args.warmup
        else:
            p = (step - args.warmup) / max(1, args.steps - args.warmup)
            lr = args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p)))
        for g in opt.param_groups:
            g["lr"] = lr
        logits = model(inp)
        nll = F.cross_entropy(logits.view(-1, 65), tgt.view(-1), reduction="none")
        m = mask.view(-1).float()
        loss = (nll * m).sum() / m.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.eval_every == 0 or step == args.steps:
            r = {"step": step, "train_loss": loss.item(), "elapsed_s": round(time.time() - t0, 1)}
            r.update(accuracy_by_shift(model, held_out))
            print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
