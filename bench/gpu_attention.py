"""PyTorch baselines for the lab's CubeCL attention kernels (bench/gpu.sh).

Times causal attention, forward and forward+backward, at the shapes `cube_bench` uses, for each encoding:

  nope         scaled_dot_product_attention(q, k, v, is_causal=True)           (FlashAttention in bf16)
  rope         RoPE (rotate-half, θ_i = 10000^(−2i/d)) in eager ops, then SDPA   (same)
  pope         PoPE's 2d-dim Cartesian q̃, k̃ in eager ops (softplus magnitudes, phases iθ and jθ+δ), then
               FlexAttention with a causal block mask and scale 1/√d (arXiv 2509.10534 §3)
  tapa         FlexAttention on q with its phase dims zeroed (so the kernel's score is q_A·k_A) and a
               `score_mod` that multiplies by cos(2π·|i−j|^α·q_P·k_P/√p), the phase dot product unrolled as
               p scalar loads from the captured q_P, k_P, or if that does not compile, as one vector load
               and a sum (arXiv 2509.12635 §3)
  tapa-linear  as tapa with the phase (Σq_P + Σk_P)/√p from two captured per-row sums

in bf16 and f32 (SDPA in f32 cannot use FlashAttention; the backend PyTorch picks is reported). Gradients flow
to q, k, v (and δ for PoPE); for TAPA also through the captured tensors when this PyTorch supports gradients of
captured buffers in FlexAttention, otherwise they are detached and the record says `"captured_grad": false`.

At seq ≤ --check-max-seq each variant's forward is first compared with the same encoding's score matrix
materialised in f32 (softmax over j ≤ i, then · v): `check_max_abs_err` in the record (expect ~1e-2 in bf16,
~1e-5 in f32).

Each timing is the median of --iters runs after --warmup runs (the first FlexAttention call compiles it), timed
with CUDA events. Prints one JSON object per line, and with --cube FILE (cube_bench's output) a table of
cube / PyTorch time ratios.

Usage: python3 bench/gpu_attention.py [--device cuda] [--seq 1024,4096,16384] [--cube cube.jsonl]
"""

import argparse
import json
import math
import statistics
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    sys.exit("PyTorch is not installed: pip install torch (needed for this benchmark only)")

try:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:
    flex_attention = None


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--seq", default="1024,4096,16384")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtypes", default="bf16,f32")
    p.add_argument("--encodings", default="nope,rope,pope,tapa,tapa-linear")
    p.add_argument("--alpha", type=float, default=0.1, help="TAPA distance exponent")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--check-max-seq", type=int, default=1024,
                   help="compare the forward with a materialised f32 reference at seq up to this")
    p.add_argument("--out", default=None, help="also append the JSON lines to this file")
    p.add_argument("--cube", default=None, help="cube_bench JSON lines, for the ratio table")
    return p.parse_args()


def timer(device):
    """Returns time_ms(fn): median wall time of fn in ms, synchronised with the device."""

    def time_ms(fn, warmup, iters):
        for _ in range(warmup):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times = []
        for _ in range(iters):
            if device.type == "cuda":
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            else:
                import time

                t = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t) * 1e3)
        return statistics.median(times)

    return time_ms


def sdpa_backend_name(q, k, v):
    """Which SDPA backend PyTorch can use for these inputs (first that accepts them)."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return "unknown"
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                    SDPBackend.MATH):
        try:
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q[:, :, :8], k[:, :, :8], v[:, :, :8], is_causal=True)
            return backend.name.lower()
        except RuntimeError:
            continue
    return "none"


def rope_rotate(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def make_encoding(name, b, h, l, d, dtype, device, alpha, capture_grad=True, phase_sum=False):
    """Returns (fn(q, k, v) -> out, extra leaf tensors needing grad, info dict, scores(q, k) -> the
    [b, h, l, l] f32 score matrix of the same encoding, materialised, for --check). The FlexAttention
    variants are whole functions under torch.compile (the encoding's eager ops fuse, and FlexAttention
    only runs its fused kernel when compiled)."""
    pos = torch.arange(l, device=device, dtype=torch.float32)
    info = {}
    if name == "nope":
        return ((lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)), [], info,
                lambda q, k: q.float() @ k.float().transpose(-1, -2) / math.sqrt(d))
    if name == "rope":
        inv = 10000.0 ** (-torch.arange(0, d, 2, device=device, dtype=torch.float32) / d)
        ang = pos[:, None] * inv[None, :]
        cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)

        def fn(q, k, v):
            return F.scaled_dot_product_attention(rope_rotate(q, cos, sin), rope_rotate(k, cos, sin), v,
                                                  is_causal=True)

        def scores(q, k):
            c, s_ = ang.cos(), ang.sin()
            qr, kr = rope_rotate(q.float(), c, s_), rope_rotate(k.float(), c, s_)
            return qr @ kr.transpose(-1, -2) / math.sqrt(d)

        return fn, [], info, scores
    if flex_attention is None:
        raise RuntimeError("FlexAttention not available in this PyTorch")
    block_mask = create_block_mask(lambda b_, h_, qi, kj: qi >= kj, B=None, H=None, Q_LEN=l, KV_LEN=l,
                                   device=device)
    if name == "pope":
        theta = 10000.0 ** (-torch.arange(d, device=device, dtype=torch.float32) / d)
        ang = pos[:, None] * theta[None, :]  # [l, d]
        delta = (torch.rand(1, h, 1, d, device=device) * -2 * math.pi).requires_grad_()

        def cartesian(q, k):
            mq, mk = F.softplus(q.float()), F.softplus(k.float())
            kang = ang + delta
            qt = torch.cat([mq * ang.cos(), mq * ang.sin()], -1)
            kt = torch.cat([mk * kang.cos(), mk * kang.sin()], -1)
            return qt, kt

        def scores(q, k):
            qt, kt = cartesian(q, k)
            return qt @ kt.transpose(-1, -2) / math.sqrt(d)

        def fn(q, k, v):
            qt, kt = cartesian(q, k)
            qt, kt = qt.to(dtype), kt.to(dtype)
            if info.get("v_padded"):  # older FlexAttention: v must have q's head dim
                vp = torch.cat([v, torch.zeros_like(v)], -1)
                return flex_attention(qt, kt, vp, block_mask=block_mask, scale=1.0 / math.sqrt(d))[..., :d]
            return flex_attention(qt, kt, v, block_mask=block_mask, scale=1.0 / math.sqrt(d))

        return torch.compile(fn, dynamic=False), [delta], info, scores
    if name in ("tapa", "tapa-linear"):
        a = d // 2
        p = d - a
        inv_sqrt_p = 1.0 / math.sqrt(p)
        two_pi = 2.0 * math.pi
        linear = name == "tapa-linear"
        info["captured_grad"] = capture_grad

        def fn(q, k, v):
            qa = torch.cat([q[..., :a], torch.zeros_like(q[..., a:])], -1)
            # Contiguous copies: captured buffers distinct from FlexAttention's own q, k inputs
            # (a view of the key input confuses Inductor's CPU template).
            qp, kp = q[..., a:].contiguous(), k[..., a:].contiguous()
            if not capture_grad:
                qp, kp = qp.detach(), kp.detach()
            if linear:
                sq, sk = qp.sum(-1), kp.sum(-1)  # [b, h, l]

                def score_mod(score, b_, h_, qi, kj):
                    dist = (qi - kj).abs().to(torch.float32)
                    dpow = torch.where(dist > 0, torch.exp(alpha * torch.log(dist.clamp(min=1.0))), 0.0)
                    phase = (sq[b_, h_, qi] + sk[b_, h_, kj]).to(torch.float32) * inv_sqrt_p
                    return score * torch.cos(two_pi * dpow * phase)
            else:

                def score_mod(score, b_, h_, qi, kj):
                    dist = (qi - kj).abs().to(torch.float32)
                    dpow = torch.where(dist > 0, torch.exp(alpha * torch.log(dist.clamp(min=1.0))), 0.0)
                    if phase_sum:  # one vector load per side and a reduction
                        acc = (qp[b_, h_, qi].to(torch.float32) * kp[b_, h_, kj].to(torch.float32)).sum(-1)
                    else:  # p scalar loads per side, unrolled
                        acc = qp[b_, h_, qi, 0].to(torch.float32) * kp[b_, h_, kj, 0].to(torch.float32)
                        for c in range(1, p):
                            acc = acc + qp[b_, h_, qi, c].to(torch.float32) * kp[b_, h_, kj, c].to(torch.float32)
                    return score * torch.cos(two_pi * dpow * acc * inv_sqrt_p)

            return flex_attention(qa, k, v, score_mod=score_mod, block_mask=block_mask, scale=1.0 / math.sqrt(a))

        def scores(q, k):
            q, k = q.float(), k.float()
            amp_ = q[..., :a] @ k[..., :a].transpose(-1, -2) / math.sqrt(a)
            if linear:
                ph = (q[..., a:].sum(-1)[..., :, None] + k[..., a:].sum(-1)[..., None, :]) * inv_sqrt_p
            else:
                ph = q[..., a:] @ k[..., a:].transpose(-1, -2) * inv_sqrt_p
            dist = (pos[:, None] - pos[None, :]).abs()
            dpow = torch.where(dist > 0, dist.clamp(min=1.0) ** alpha, torch.zeros_like(dist))
            return amp_ * torch.cos(two_pi * dpow * ph)

        return torch.compile(fn, dynamic=False), [], info, scores
    raise ValueError(f"unknown encoding {name}")


def run_case(rec, enc, q, k, v, g, dtype, device, args, time_ms):
    b, h, l, d = q.shape
    rec["kernel"] = ("sdpa:" + sdpa_backend_name(q, k, v)) if enc in ("nope", "rope") else "flex"
    # FlexAttention variants that PyTorch versions differ on are tried in order: PoPE with v of head dim d,
    # then padded to 2d; TAPA with gradients through the captured q_P, k_P, then detached.
    attempts = [{}]
    if enc == "pope":
        attempts = [{}, {"v_padded": True}]
    elif enc == "tapa-linear":
        attempts = [{"capture_grad": True}, {"capture_grad": False}]
    elif enc == "tapa":
        attempts = [{"capture_grad": g, "phase_sum": s_} for s_ in (False, True) for g in (True, False)]
    last = None
    for attempt in attempts:
        try:
            fn, extra, info, scores = make_encoding(enc, b, h, l, d, dtype, device, args.alpha,
                                                    capture_grad=attempt.get("capture_grad", True),
                                                    phase_sum=attempt.get("phase_sum", False))
            info.update(attempt)
            if l <= args.check_max_seq:
                # The same encoding materialised in f32: softmax over j ≤ i, then · v.
                with torch.no_grad():
                    s_ = scores(q.detach(), k.detach())
                    mask = torch.ones(l, l, dtype=torch.bool, device=device).tril()
                    ref = torch.softmax(s_.masked_fill(~mask, float("-inf")), -1) @ v.detach().float()
                    got = fn(q.detach(), k.detach(), v.detach()).float()
                    rec["check_max_abs_err"] = float((got - ref).abs().max())

            def fwd():
                with torch.no_grad():
                    fn(q, k, v)

            def fwd_bwd():
                out = fn(q, k, v)
                out.backward(g)
                for t in [q, k, v] + extra:
                    t.grad = None

            rec["fwd_ms"] = round(time_ms(fwd, args.warmup, args.iters), 4)
            rec["fwd_bwd_ms"] = round(time_ms(fwd_bwd, args.warmup, args.iters), 4)
            rec.update({k_: v_ for k_, v_ in info.items() if k_ != "v_padded" or v_})
            rec.pop("error", None)
            return
        except Exception as e:
            last = e
            rec.setdefault("failed_attempts", []).append(
                {**attempt, "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]})
            torch._dynamo.reset()
    raise last


def main():
    args = parse()
    device = torch.device(args.device)
    time_ms = timer(device)
    dtypes = {"bf16": torch.bfloat16, "f32": torch.float32}
    b, h, d = args.batch, args.heads, args.head_dim
    records = []
    out_file = open(args.out, "a") if args.out else None
    for l in [int(s) for s in args.seq.split(",")]:
        for dname in args.dtypes.split(","):
            dtype = dtypes[dname]
            for enc in args.encodings.split(","):
                torch.manual_seed(0)
                q = (torch.rand(b, h, l, d, device=device) * 2 - 1).to(dtype).requires_grad_()
                k = (torch.rand(b, h, l, d, device=device) * 2 - 1).to(dtype).requires_grad_()
                v = (torch.rand(b, h, l, d, device=device) * 2 - 1).to(dtype).requires_grad_()
                g = torch.rand(b, h, l, d, device=device).to(dtype)
                rec = {"impl": "torch", "encoding": enc, "dtype": dname, "batch": b, "heads": h, "seq": l,
                       "head_dim": d, "torch": torch.__version__}
                try:
                    run_case(rec, enc, q, k, v, g, dtype, device, args, time_ms)
                except Exception as e:  # record and go on: one unsupported case must not stop the sweep
                    rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
                line = json.dumps(rec)
                print(line, flush=True)
                if out_file:
                    out_file.write(line + "\n")
                    out_file.flush()
                records.append(rec)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    if args.cube:
        print_ratios(args.cube, records)


def print_ratios(cube_path, torch_records):
    cube = {}
    with open(cube_path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                r = json.loads(line)
                cube.setdefault((r["encoding"], r["seq"]), []).append(r)
    print()
    print("cube (f32) time / PyTorch time; > 1 means the cube kernel is slower")
    print(f"{'encoding':<12} {'seq':>6} {'torch':>6} {'kernel':<22} {'cube':<6} {'fwd ratio':>10} {'f+b ratio':>10}"
          f" {'cube fwd ms':>12} {'cube f+b ms':>12} {'torch fwd ms':>13} {'torch f+b ms':>13}")
    for r in torch_records:
        cs = cube.get((r["encoding"], r["seq"]), [])
        if not cs or "fwd_ms" not in r:
            reason = r.get("error", "no cube result")
            print(f"{r['encoding']:<12} {r['seq']:>6} {r['dtype']:>6} {'-':<22} {reason}")
            continue
        for c in cs:
            print(f"{r['encoding']:<12} {r['seq']:>6} {r['dtype']:>6} {r['kernel']:<22} {c.get('strategy', '?'):<6}"
                  f" {c['fwd_ms'] / r['fwd_ms']:>10.2f} {c['fwd_bwd_ms'] / r['fwd_bwd_ms']:>10.2f}"
                  f" {c['fwd_ms']:>12.3f} {c['fwd_bwd_ms']:>12.3f} {r['fwd_ms']:>13.3f} {r['fwd_bwd_ms']:>13.3f}")


if __name__ == "__main__":
    main()
