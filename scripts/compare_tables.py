#!/usr/bin/env python3
"""Compare two results folders table by table (e.g. a sweep's smoke preset before and after a
refactor): same rows, same values, timing columns aside.

Usage: python3 scripts/compare_tables.py [--schema-change] BEFORE AFTER
Prints, per table, the rows and the largest absolute difference of every differing numeric column;
exits 1 when a table or a non-timing value differs.

--schema-change: BEFORE was written by a lab of an older schema version (run ids and the canonical
config JSON differ by design): in BEFORE the parameters of tasks other than the row's own (which
schema 2 no longer gives a run: null after) and of encodings other than the row's own (schema 3)
are set to null first, and counted; runs are matched
on their config columns and BEFORE's run ids replaced by AFTER's; eval_id, config_json and
schema_version are left out; rows are sorted on every compared column.
"""

import math
import sys
from pathlib import Path

import polars as pl

TIMING = ("wall", "ms_per", "probe_ms", "tokens_per_s", "time", "host", "pid", "created")
IDENTITY = ("eval_id", "config_json", "schema_version")
# Each task's own parameters (lab/src/task.rs); schema 1 wrote every task's in every row.
TASK_PARAMS = {
    "block": ("variant", "block_len", "noise"),
    "indirect": ("min_letters", "max_letters", "max_shift"),
    "igsm": ("ops", "distractors"),
    "needle": ("needle_depth", "key_len", "value_len", "haystack"),
    "corpus": ("corpus", "granularity"),
}


# Each encoding's own parameters (lab/src/model/*.rs); schema 2 wrote TAPA's and PoPE's in every row.
ENCODING_PARAMS = {
    "pope": ("pope_delta_init",),
    "tapa": ("tapa_rho", "tapa_alpha", "tapa_phase", "tapa_phase_init_scale"),
    "p-rope": ("rope_p",),
    "partial-rope": ("rotary_dim",),
}


def drop_foreign_params(df: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """Null every task (encoding) parameter of a row whose task (encoding) does not have it; how
    many were set."""
    n = 0
    for key, params in (("task", TASK_PARAMS), ("encoding", ENCODING_PARAMS)):
        if key not in df.columns:
            continue
        for c in sorted({c for ps in params.values() for c in ps} & set(df.columns)):
            owners = [t for t, ps in params.items() if c in ps]
            foreign = ~pl.col(key).is_in(owners)
            n += df.filter(foreign & pl.col(c).is_not_null()).height
            df = df.with_columns(pl.when(foreign).then(None).otherwise(pl.col(c)).alias(c))
    return df, n


def is_timing(col: str) -> bool:
    return any(t in col for t in TIMING)


def run_id_map(before: Path, after: Path) -> dict[str, str]:
    """BEFORE's run id → AFTER's, matching runs on every column but the identity and timing ones."""
    if not (before / "runs.parquet").exists() or not (after / "runs.parquet").exists():
        return {}
    b, _ = drop_foreign_params(pl.read_parquet(before / "runs.parquet"))
    a = pl.read_parquet(after / "runs.parquet")
    cols = [c for c in b.columns if c in a.columns and not is_timing(c)
            and c not in IDENTITY and c != "run_id"]
    b, a = b.sort(cols, nulls_last=True), a.sort(cols, nulls_last=True)
    return dict(zip(b["run_id"].to_list(), a["run_id"].to_list()))


def main() -> int:
    args = sys.argv[1:]
    schema_change = "--schema-change" in args
    args = [a for a in args if a != "--schema-change"]
    before, after = Path(args[0]), Path(args[1])
    bad = 0
    ids = run_id_map(before, after) if schema_change else {}
    for fb in sorted(before.glob("*.parquet")):
        fa = after / fb.name
        if not fa.exists():
            print(f"{fb.name}: missing after")
            bad += 1
            continue
        a, b = pl.read_parquet(fa), pl.read_parquet(fb)
        dropped = 0
        if schema_change:
            b, dropped = drop_foreign_params(b)
            if "run_id" in b.columns:
                b = b.with_columns(pl.col("run_id").replace_strict(ids, default=None))
        cols = [c for c in b.columns if c in a.columns and not is_timing(c)]
        if schema_change:
            cols = [c for c in cols if c not in IDENTITY]
        only = sorted(set(a.columns) ^ set(b.columns))
        keys = [c for c in cols if b[c].dtype in (pl.Utf8, pl.Int64, pl.Int32, pl.Boolean)]
        if schema_change:
            keys = cols
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
        if dropped:
            extra += f" ({dropped} values of other tasks' or encodings' parameters null after)"
        print(f"{fb.name}: {b.height} rows, {status}{extra}")
        bad += bool(diffs)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
