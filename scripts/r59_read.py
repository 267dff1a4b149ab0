"""Read docs/analysis-rules.md R59 (issue 52, item 5): each TAPA variant's fraction of the gap to RoPE closed.

  python3 scripts/r59_read.py results/rs-tapa results/rs-quick [--tapa-sd chorales=0.0228,shakespeare=0.0185]

The first folder holds `lab sweep real-sequences --preset tapa-hypotheses` (selected runs, R58), the second the
default preset's runs (RoPE and TAPA at their learning rates chosen by the tune preset, seeds 0-2): seed 0 gives
the references, seeds 0-2 TAPA's seed sd (the noise threshold, 2 sd). Per corpus and variant it prints the
selected learning rate, the test NLL at 1x, f = (NLL_TAPA - NLL_variant) / (NLL_TAPA - NLL_RoPE), whether the
change is within noise, and whether the variant is within 2 % of RoPE (parity); then each hypothesis's verdict.
"""

import sys

import polars as pl

VARIANTS = [
    ("H-rho", "tapa_rho", 0.25), ("H-rho", "tapa_rho", 0.75),
    ("H-alpha", "tapa_alpha", 0.5), ("H-alpha", "tapa_alpha", 1.0),
    ("H-init", "tapa_phase_init_scale", 10.0), ("H-init", "tapa_phase_init_scale", 100.0),
    ("H-lr", "tapa_phase_gain", 100.0),
]


def main(hyp_dir, ref_dir, tapa_sd):
    h = pl.read_parquet(f"{hyp_dir}/runs.parquet").filter(pl.col("selected"))
    r = pl.read_parquet(f"{ref_dir}/runs.parquet").filter(pl.col("status") == "done")
    verdict = {}
    for corpus in ["chorales", "shakespeare"]:
        rc = r.filter(pl.col("corpus") == corpus)
        rope = rc.filter((pl.col("encoding") == "rope") & (pl.col("seed") == 0))["final_eval_loss"][0]
        tapa_all = rc.filter(pl.col("encoding") == "tapa")["final_eval_loss"]
        tapa = rc.filter((pl.col("encoding") == "tapa") & (pl.col("seed") == 0))["final_eval_loss"][0]
        sd = tapa_all.std() if tapa_all.len() >= 2 else tapa_sd.get(corpus, float("nan"))
        noise = 2 * sd
        print(f"{corpus}: RoPE {rope:.4f}, TAPA default {tapa:.4f} (gap {tapa - rope:+.4f}); "
              f"noise 2 sd over {tapa_all.len()} seeds = {noise:.4f}")
        hc = h.filter(pl.col("corpus") == corpus)
        for hyp, key, val in VARIANTS:
            row = hc.filter(pl.col(key) == val)
            if row.height != 1:
                print(f"  {hyp} {key}={val}: {row.height} selected runs (expected 1)")
                continue
            nll = row["final_eval_loss"][0]
            f = (tapa - nll) / (tapa - rope)
            inside = abs(tapa - nll) < noise
            parity = nll <= 1.02 * rope
            print(f"  {hyp:8s} {key}={val:<6}: lr {row['lr'][0]:<6} test NLL {nll:.4f}  f = {f:+.2f}"
                  f"{'  (within noise)' if inside else ''}{'  PARITY' if parity else ''}")
            # Within noise counts as no gap closed (f < 0.2) for the verdict.
            best = verdict.setdefault(hyp, {}).get(corpus)
            score = min(f, 0.0) if inside else f
            if best is None or score > best[0]:
                verdict[hyp][corpus] = (score, f, inside)
    print("verdicts (the better variant of each hypothesis; a change within noise counts as f < 0.2):")
    for hyp, by in verdict.items():
        got = [by.get(c, (-1.0, float("nan"), False)) for c in ["chorales", "shakespeare"]]
        fs = [g[0] for g in got]
        if all(x >= 0.5 for x in fs):
            v = "supported"
        elif any(x >= 0.5 for x in fs) or all(x >= 0.2 for x in fs):
            v = "partial"
        else:
            v = "not supported"
        words = [f"{g[1]:+.2f}{' (within noise)' if g[2] else ''}" for g in got]
        print(f"  {hyp}: f chorales {words[0]}, prose {words[1]} -> {v}")


if __name__ == "__main__":
    args = sys.argv[1:]
    sds = {}
    if len(args) == 4 and args[2] == "--tapa-sd":
        sds = {k: float(v) for k, v in (kv.split("=") for kv in args[3].split(","))}
        args = args[:2]
    if len(args) != 2:
        sys.exit(__doc__)
    main(args[0], args[1], sds)
