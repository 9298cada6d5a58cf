#!/usr/bin/env python3
"""Benchmark `torchport::cast::cast` (float32 -> float16 / bfloat16) against torch's
`.to(dtype)` on the same 64 MiB of data, in one run; prints medians and ratios, and checks
that both made the same bytes.

    cargo build --release -p torchport --example cast_bench
    /work/main/.venv/bin/python benches/cast_bench.py [--mib 64] [--runs 5]

torch runs with 1 thread (torchport's cast is single-threaded) and with its default thread
count. The "f64-route" line times the old cast (every value decoded into a Vec<f64>, then
encoded), for before/after.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "benches" / "data"


def torch_ms(x: torch.Tensor, dtype, runs: int) -> tuple[float, torch.Tensor]:
    y = x.to(dtype)  # warm-up
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        y = x.to(dtype)
        times.append((time.perf_counter() - t) * 1e3)
    return sorted(times)[len(times) // 2], y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--bin", type=Path, default=REPO / "target" / "release" / "examples" / "cast_bench")
    args = ap.parse_args()
    if not args.bin.exists():
        raise SystemExit(f"{args.bin} missing: cargo build --release -p torchport --example cast_bench")
    DATA.mkdir(parents=True, exist_ok=True)
    x = torch.randn(args.mib * (1 << 20) // 4, generator=torch.Generator().manual_seed(0))
    src = DATA / "cast_f32.bin"
    src.write_bytes(x.numpy().tobytes())
    out = DATA / "cast_out"
    r = subprocess.run([str(args.bin), str(src), str(out), str(args.runs)],
                       capture_output=True, text=True, check=True)
    rust = {}
    for line in r.stdout.splitlines():
        pair, route, ms = line.split()[:3]
        rust[(pair, route)] = float(ms)
    default_threads = torch.get_num_threads()
    print(f"{args.mib} MiB float32, median of {args.runs}; {os.cpu_count()} cores; "
          f"load {os.getloadavg()[0]:.2f}; torchport 1 thread; torch {torch.__version__}")
    for dtype, ext in ((torch.float16, "f16"), (torch.bfloat16, "bf16")):
        name = f"float32->{str(dtype).removeprefix('torch.')}"
        torch.set_num_threads(1)
        t1, y = torch_ms(x, dtype, args.runs)
        torch.set_num_threads(default_threads)
        tn, _ = torch_ms(x, dtype, args.runs)
        same = (DATA / f"cast_out.{ext}").read_bytes() == y.view(torch.int16).numpy().tobytes()
        d, old = rust[(name, "direct")], rust[(name, "f64-route")]
        print(f"{name:18s} torchport {d:7.1f} ms (old f64 route {old:7.1f} ms, {old / d:4.1f}x)  "
              f"torch 1 thread {t1:6.1f} ms, {default_threads} threads {tn:6.1f} ms  "
              f"torchport/torch(1t) {d / t1:4.2f}x  same bytes: {same}")
    for p in (src, DATA / "cast_out.f16", DATA / "cast_out.bf16"):
        p.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
