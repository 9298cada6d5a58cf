#!/usr/bin/env python3
"""Benchmark `torchport convert big.pt out.safetensors` against the Python path
(torch.load + safetensors.torch.save_file) and against `cp` (the floor), in one run.

Not a test: it prints timings, peak RSS and ratios. Each command runs once to warm the page
cache (it cannot be dropped without root on every machine, so every side reads a warm cache),
then --runs more times; the median run is reported (on a shared machine single runs vary by
tens of percent). Peak RSS comes from /usr/bin/time -v (apt-get install time).

    cargo build --release -p torchport-cli
    /work/main/.venv/bin/python benches/convert_bench.py [--size-mib 1024] [--tensor-mib 32]

The input, benches/data/big.pt (gitignored), is made on demand: float32 tensors of
--tensor-mib each, plus a few small ones, saved by torch.save, about --size-mib in all.
Goals (from the issue): >= 3x faster than the Python path, within 1.5x of cp, peak RSS
< 1.2 x largest tensor + 50 MB.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "benches" / "data"
PY = sys.executable


def make_input(path: Path, size_mib: int, tensor_mib: int):
    import torch
    torch.manual_seed(0)
    n = max(1, size_mib // tensor_mib)
    numel = tensor_mib * (1 << 20) // 4
    sd = {}
    for i in range(n):
        sd[f"layers.{i}.weight"] = torch.randn(numel // 1024, 1024)
        sd[f"layers.{i}.bias"] = torch.randn(1024)
    sd["head.weight"] = torch.randn(1000, 64)
    torch.save(sd, path)


def timed(cmd: list[str], env=None) -> tuple[float, int]:
    """(wall seconds, peak RSS in KiB) of one run under /usr/bin/time -v."""
    r = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"command failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr}")
    wall = re.search(r"Elapsed \(wall clock\) time.*: (?:(\d+):)?(\d+):([\d.]+)", r.stderr)
    h, m, s = wall.groups()
    seconds = int(h or 0) * 3600 + int(m) * 60 + float(s)
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1))
    return seconds, rss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--tensor-mib", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--bin", type=Path, default=REPO / "target" / "release" / "torchport")
    args = ap.parse_args()
    if not args.bin.exists():
        sys.exit(f"{args.bin} missing: cargo build --release -p torchport-cli")
    DATA.mkdir(parents=True, exist_ok=True)
    big = DATA / f"big_{args.size_mib}m_{args.tensor_mib}m.pt"
    if not big.exists():
        print(f"making {big} ...", flush=True)
        make_input(big, args.size_mib, args.tensor_mib)
    size = big.stat().st_size
    largest = args.tensor_mib * (1 << 20)
    out_rs = DATA / "out_torchport.safetensors"
    out_py = DATA / "out_python.safetensors"
    copy = DATA / "copy.pt"
    py_code = ("import torch, safetensors.torch as st; "
               f"sd = torch.load({str(big)!r}, weights_only=True, map_location='cpu'); "
               f"st.save_file(sd, {str(out_py)!r}, metadata={{'format': 'pt'}})")
    cases = [  # label, command, its output
        ("torchport convert", [str(args.bin), "convert", str(big), str(out_rs)], out_rs),
        ("python torch.load + save_file", [PY, "-c", py_code], out_py),
        ("cp", ["cp", str(big), str(copy)], copy),
        ("cp + sync (fsync'd copy)", ["sh", "-c", f"cp {big} {copy} && sync {copy}"], copy),
    ]
    import torch
    print(f"command: {' '.join(cases[0][1])}")
    print(f"input: {big.name}, {size / 2**20:.0f} MiB, largest tensor {largest / 2**20:.0f} MiB; "
          f"{os.cpu_count()} cores; torchport copies on one thread (a second only issues writeback "
          f"hints); torch {torch.__version__} "
          f"with {torch.get_num_threads()} threads")
    results = {}
    for label, cmd, out in cases:
        out.unlink(missing_ok=True)
        timed(cmd)  # warm-up run (fills the page cache)
        out.unlink(missing_ok=True)
        runs = []
        for _ in range(args.runs):
            out.unlink(missing_ok=True)
            runs.append(timed(cmd))
        runs.sort()
        results[label] = runs[len(runs) // 2]
        s, rss = results[label]
        spread = ", ".join(f"{r[0]:.2f}" for r in runs)
        print(f"{label:32s} {s:7.2f} s  {size / 2**20 / s:7.0f} MiB/s  peak RSS {rss / 1024:7.1f} MiB"
              f"  (runs: {spread} s)", flush=True)
    same = out_rs.exists() and out_py.exists()
    if same:
        import safetensors.torch as st
        a, b = st.load_file(out_rs), st.load_file(out_py)
        same = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        print(f"outputs hold identical tensors: {same}")
    t_rs, rss_rs = results["torchport convert"]
    t_py, _ = results["python torch.load + save_file"]
    t_cp, _ = results["cp"]
    t_cps, _ = results["cp + sync (fsync'd copy)"]
    limit = 1.2 * largest / 1024 + 50 * 1000  # KiB (50 MB)
    print(f"\nspeed-up over Python: {t_py / t_rs:.2f}x (goal >= 3x)")
    print(f"torchport / cp:       {t_rs / t_cp:.2f}x (goal <= 1.5x); / cp+sync: {t_rs / t_cps:.2f}x")
    print(f"peak RSS:             {rss_rs / 1024:.1f} MiB (goal < {limit / 1024:.1f} MiB = "
          f"1.2 x {largest / 2**20:.0f} MiB + 50 MB)")
    for f in (out_rs, out_py, copy):
        f.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
