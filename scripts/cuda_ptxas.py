#!/usr/bin/env python3
"""Compile the CUDA C++ of `lab bench cuda-source` as a GPU machine would, and report each kernel's
registers, spills and shared memory (issue 20; `make cuda-ptxas`, scripts/cuda-ptxas.sh).

Each `.cu` file listed in `kernels.tsv` goes through NVRTC (loaded with ctypes from the CUDA wheels'
`libnvrtc.so.13`) with the options cubecl-cuda 0.11.3 passes on an sm >= 90 device
(`--gpu-architecture=sm_XXa`, `--include-path=<cuda>/include`, `-lineinfo`, and the CCCL include folder),
then the PTX through `ptxas -v` for that architecture, which prints what the driver's JIT would allocate:
registers per thread, spill stores and loads (bytes), stack frame (local memory per thread: spills and
arrays the compiler could not keep in registers), shared memory (ptxas's static count plus cubecl's dynamic
shared memory from `kernels.tsv`); and from
them each kernel's theoretical occupancy on an sm 90 SM (`occupancy`).

Usage: cuda_ptxas.py --cuda DIR --sources DIR --sm 90 [--json OUT.jsonl] [--markdown OUT.md]
No GPU and no network: NVRTC and ptxas run on the CPU.
"""

import argparse
import ctypes
import json
import re
import subprocess
import sys
from pathlib import Path


def nvrtc_ptx(lib, source: str, name: str, options: list[str]) -> tuple[bytes | None, str]:
    """(PTX, log) of one translation unit; PTX None when NVRTC refuses it."""
    prog = ctypes.c_void_p()
    rc = lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None)
    if rc != 0:
        return None, f"nvrtcCreateProgram failed ({rc})"
    try:
        opts = [o.encode() for o in options]
        arr = (ctypes.c_char_p * len(opts))(*opts)
        rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, buf)
        log = buf.value.decode(errors="replace").strip()
        if rc != 0:
            return None, log
        lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
        ptx = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetPTX(prog, ptx)
        return ptx.raw.rstrip(b"\0"), log
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


PTXAS_USED = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:, (\d+) bytes smem)?")
PTXAS_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def parse_ptxas(text: str) -> dict:
    """Registers, barriers, smem, stack frame and spills from `ptxas -v` (one entry function)."""
    out = {"registers": None, "barriers": 0, "smem_bytes": 0, "stack_bytes": 0,
           "spill_stores": 0, "spill_loads": 0}
    m = PTXAS_USED.search(text)
    if m:
        out["registers"] = int(m.group(1))
        out["barriers"] = int(m.group(2) or 0)
        out["smem_bytes"] = int(m.group(3) or 0)
    m = PTXAS_FRAME.search(text)
    if m:
        out["stack_bytes"], out["spill_stores"], out["spill_loads"] = map(int, m.groups())
    return out


def occupancy(registers: int, smem_bytes: int, units: int) -> tuple[int, float]:
    """(cubes resident per SM, theoretical occupancy = resident warps / 64) on an sm 90 SM, by the
    rules of NVIDIA's occupancy calculator for compute capability 9.0: 65536 registers per SM allocated
    per warp in units of 256, at most 64 warps, 32 blocks and 228 KiB of shared memory per SM, 1 KiB of
    it reserved per block. Spilled registers are not counted (they live in local memory)."""
    warps = -(-units // 32)
    regs_per_warp = -(-max(registers, 1) * 32 // 256) * 256
    by_regs = (65536 // regs_per_warp) // warps
    by_smem = (228 * 1024) // (smem_bytes + 1024)
    by_warps = 64 // warps
    cubes = min(by_regs, by_smem, by_warps, 32)
    return cubes, cubes * warps / 64


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cuda", required=True, type=Path, help="unpacked CUDA wheels (bin/, include/, lib/)")
    ap.add_argument("--sources", required=True, type=Path, help="`lab bench cuda-source --out` folder")
    ap.add_argument("--sm", type=int, default=90)
    ap.add_argument("--json", type=Path, help="write one JSON line per kernel here")
    ap.add_argument("--markdown", type=Path, help="write the table here too")
    args = ap.parse_args()

    lib_path = args.cuda / "lib" / "libnvrtc.so.13"
    if not lib_path.exists():
        print(f"error: --cuda {args.cuda}: no lib/libnvrtc.so.13 (run scripts/cuda-ptxas.sh)", file=sys.stderr)
        return 2
    index = args.sources / "kernels.tsv"
    if not index.exists():
        print(f"error: --sources {args.sources}: no kernels.tsv (lab bench cuda-source --out DIR)", file=sys.stderr)
        return 2
    # NVRTC dlopens its builtins library by soname: loaded first, it is found without LD_LIBRARY_PATH.
    for builtins in sorted((args.cuda / "lib").glob("libnvrtc-builtins.so.*")):
        if ".alt." not in builtins.name:
            ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(str(lib_path))
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    arch = f"sm_{args.sm}a" if args.sm >= 90 else f"sm_{args.sm}"
    options = [f"--gpu-architecture={arch}", f"--include-path={args.cuda / 'include'}", "-lineinfo"]
    cccl = args.cuda / "include" / "cccl"
    if cccl.exists():
        options.append(f"--include-path={cccl}")
    ptxas = args.cuda / "bin" / "ptxas"
    ptxas_version = subprocess.run([str(ptxas), "--version"], capture_output=True, text=True).stdout
    ptxas_version = ptxas_version.strip().splitlines()[-1] if ptxas_version.strip() else "?"
    print(f"NVRTC {major.value}.{minor.value}, ptxas {ptxas_version}; {arch}; options {' '.join(options)}")

    rows, failed = [], 0
    lines = index.read_text().splitlines()
    header = lines[0].split("\t")
    for line in lines[1:]:
        entry = dict(zip(header, line.split("\t")))
        src = (args.sources / entry["file"]).read_text()
        ptx, log = nvrtc_ptx(lib, src, entry["file"], options)
        row = {"file": entry["file"], "kernel": entry["kernel"], "cube_dim": entry["cube_dim"],
               "uses": entry["uses"], "sm": arch}
        if ptx is None:
            failed += 1
            row["error"] = log
            print(f"{entry['file']}: NVRTC refused it:\n{log}", file=sys.stderr)
            rows.append(row)
            continue
        ptx_path = args.sources / (Path(entry["file"]).stem + ".ptx")
        ptx_path.write_bytes(ptx)
        res = subprocess.run([str(ptxas), f"-arch={arch}", "-v", "-o", "/dev/null", str(ptx_path)],
                             capture_output=True, text=True)
        if res.returncode != 0:
            failed += 1
            row["error"] = res.stderr.strip()
            print(f"{entry['file']}: ptxas failed:\n{res.stderr}", file=sys.stderr)
            rows.append(row)
            continue
        row.update(parse_ptxas(res.stderr + res.stdout))
        units = 1
        for n in entry["cube_dim"].split("x"):
            units *= int(n)
        # cubecl's shared memory is dynamic (`extern __shared__`, sized at launch: kernels.tsv), ptxas
        # counts only the static part
        row["smem_bytes"] += int(entry.get("shared_bytes") or 0)
        row["cubes_per_sm"], row["occupancy"] = occupancy(row["registers"] or 1, row["smem_bytes"], units)
        rows.append(row)

    head = ("| file | kernel | units | registers | spill stores / loads (B) | stack (B) | shared (B) | "
            "occupancy | used by |")
    table = [head, "|" + "---|" * 9]
    for r in rows:
        if "error" in r:
            table.append(f"| {r['file']} | {r['kernel']} | {r['cube_dim']} | failed | | | | | {r['uses']} |")
        else:
            table.append(f"| {r['file']} | {r['kernel']} | {r['cube_dim']} | {r['registers']} | "
                         f"{r['spill_stores']} / {r['spill_loads']} | {r['stack_bytes']} | "
                         f"{r['smem_bytes']} | {r['occupancy']:.2f} ({r['cubes_per_sm']} cubes) | "
                         f"{r['uses'].replace(',', ', ')} |")
    text = "\n".join(table)
    print(text)
    if args.json:
        args.json.write_text("".join(json.dumps(r) + "\n" for r in rows))
    if args.markdown:
        args.markdown.write_text(text + "\n")
    print(f"{len(rows) - failed} of {len(rows)} kernels compiled for {arch}" + (f"; {failed} failed" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
