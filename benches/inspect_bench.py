#!/usr/bin/env python3
"""Benchmark: `torchport inspect` of a ~1 GB checkpoint against `torch.load(..., mmap=True)`.

Not a test. Run from the repository root after `cargo build --release -p torchport-cli`:

    .venv/bin/python benches/inspect_bench.py [--size-mb 1024] [--runs 5]

It writes benches/data/big_<N>mb.pt once (gitignored), then, in one run, times
  - `target/release/torchport inspect FILE --json` (whole process: start, read, print), and
  - `torch.load(FILE, mmap=True, weights_only=True)` inside an already-started Python with
    torch imported (so Python's and torch's start-up are *not* counted against torch),
reporting the median wall time and each process's peak RSS (from wait4), and the ratio.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "target" / "release" / "torchport"


def make_checkpoint(path: Path, size_mb: int) -> None:
    import torch

    torch.manual_seed(0)
    # 256 tensors of a transformer-like mix of shapes, about size_mb in total.
    per = size_mb * (1 << 20) // 256 // 4
    sd = {}
    for i in range(256):
        cols = 1024
        sd[f"layers.{i // 4}.block{i % 4}.weight"] = torch.randn(max(per // cols, 1), cols)
        sd[f"layers.{i // 4}.block{i % 4}.bias"] = torch.zeros(cols)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(sd, path)


def run_measured(cmd):
    """Run a command; return (wall seconds, peak RSS in MiB, stdout bytes)."""
    start = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = p.stdout.read()
    p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"command failed: {cmd}")
    return wall, usage.ru_maxrss / 1024, out


TORCH_SNIPPET = r"""
import resource, sys, time, torch
t = time.perf_counter()
sd = torch.load(sys.argv[1], mmap=True, weights_only=True)
n = sum(v.numel() for v in sd.values())
el = time.perf_counter() - t
print(el, n, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    path = ROOT / "benches" / "data" / f"big_{args.size_mb}mb.pt"
    if not path.exists():
        print(f"writing {path} ...", flush=True)
        # In a child process, so this process stays small: a forked child's peak RSS
        # counts the parent's pages until exec.
        subprocess.run(
            [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
             f"import inspect_bench as b; b.make_checkpoint(b.Path({str(path)!r}), {args.size_mb})"],
            check=True,
        )
    if not BIN.exists():
        sys.exit("build first: cargo build --release -p torchport-cli")
    size = path.stat().st_size
    print(f"file: {path.name}, {size / (1 << 20):.0f} MiB; threads: torchport 1, torch {os.cpu_count()} (default)")

    ours = [run_measured([str(BIN), "inspect", str(path), "--json"]) for _ in range(args.runs)]
    ours_t = statistics.median(w for w, _, _ in ours)
    ours_rss = max(r for _, r, _ in ours)

    torch_runs = []
    for _ in range(args.runs):
        _, rss, out = run_measured([sys.executable, "-c", TORCH_SNIPPET, str(path)])
        el, _, _ = out.split()
        torch_runs.append((float(el), rss))
    torch_t = statistics.median(t for t, _ in torch_runs)
    torch_rss = max(r for _, r in torch_runs)

    print(f"torchport inspect --json (whole process) : {ours_t * 1000:8.1f} ms   peak RSS {ours_rss:7.1f} MiB")
    print(f"torch.load(mmap=True) (load call only)   : {torch_t * 1000:8.1f} ms   peak RSS {torch_rss:7.1f} MiB (incl. torch import)")
    print(f"ratio torch/torchport time: {torch_t / ours_t:.1f}x")


if __name__ == "__main__":
    main()
