#!/usr/bin/env python3
"""Compare two results folders table by table (e.g. a sweep's smoke preset before and after a
refactor): same rows, same values, timing columns aside.

Usage: python3 scripts/compare_tables.py BEFORE AFTER
Prints, per table, the rows and the largest absolute difference of every differing numeric column;
exits 1 when a table or a non-timing value differs.
"""

import math
import sys
from pathlib import Path

import polars as pl

TIMING = ("wall", "ms_per", "probe_ms", "tokens_per_s", "time", "host", "pid", "created")


def is_timing(col: str) -> bool:
    return any(t in col for t in TIMING)


def main() -> int:
    before, after = Path(sys.argv[1]), Path(sys.argv[2])
    bad = 0
    for fb in sorted(before.glob("*.parquet")):
        fa = after / fb.name
        if not fa.exists():
            print(f"{fb.name}: missing after")
            bad += 1
            continue
        a, b = pl.read_parquet(fa), pl.read_parquet(fb)
        cols = [c for c in b.columns if c in a.columns and not is_timing(c)]
        only = sorted(set(a.columns) ^ set(b.columns))
        keys = [c for c in cols if b[c].dtype in (pl.Utf8, pl.Int64, pl.Int32, pl.Boolean)]
        a, b = a.select(cols).sort(keys, nulls_last=True), b.select(cols).sort(keys, nulls_last=True)
        if a.height != b.height:
            print(f"{fb.name}: {b.height} rows before, {a.height} after")
            bad += 1
            continue
        diffs = []
        for c in cols:
            if b[c].dtype in (pl.Float64, pl.Float32):
                x, y = a[c].to_list(), b[c].to_list()
                d = max(
                    (abs(p - q) for p, q in zip(x, y) if p is not None and q is not None
                     and not (math.isnan(p) and math.isnan(q))),
                    default=0.0,
                )
                nulls = sum((p is None) != (q is None) for p, q in zip(x, y))
                if d > 0 or nulls:
                    diffs.append(f"{c} max |Δ| = {d:.3g}" + (f", {nulls} nulls differ" if nulls else ""))
            elif a[c].to_list() != b[c].to_list():
                diffs.append(f"{c} differs")
        status = "identical" if not diffs else "; ".join(diffs)
        extra = f" (columns only on one side: {', '.join(only)})" if only else ""
        print(f"{fb.name}: {b.height} rows, {status}{extra}")
        bad += bool(diffs)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
