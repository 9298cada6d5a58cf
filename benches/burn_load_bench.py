#!/usr/bin/env python3
"""Loading a ~540 MB checkpoint into a Burn model, against reading the file once.

    /work/main/.venv/bin/python benches/burn_load_bench.py [--runs 5] [--layers 8] [--n 4096]

Writes (once) a state_dict of LAYERS nn.Linear(N, N) layers with torch.save into
$TMPDIR/torchport-bench/, builds the Rust example `burn_load_bench` in release mode, warms the
page cache, then alternates RUNS times, each in a fresh process:
    read   std::fs::read of the whole file (the baseline: reading the file once)
    load   torchport_burn::TorchportStore::open(file).load(Vec<Linear>) — every weight is
           transposed from PyTorch's [out, in] into Burn's [in, out] on the way
and, for reference, PyTorch itself: torch.load + load_state_dict into the same nn.Module.
Prints the median of each, the ratio load/read (target: <= 1.5), and memory: the peak resident
set and, at the end, the anonymous (heap) and file-backed (mmap) parts — a full in-memory copy
of the file would show as an anonymous peak of about twice the file size.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def make_checkpoint(path: Path, layers: int, n: int):
    import torch

    class Stack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(n, n) for _ in range(layers))

    if path.exists():
        return Stack
    torch.manual_seed(0)
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        m = Stack()
    torch.save(m.state_dict(), path)
    return Stack


def run(binary: Path, *args) -> dict:
    out = subprocess.run([str(binary), *map(str, args)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def torch_load_code(path: Path, layers: int, n: int) -> str:
    """A Python program timing torch.load + load_state_dict in a fresh process."""
    code = (
        "import sys, time, torch\n"
        "sys.path.insert(0, %r)\n"
        "from burn_load_bench import make_checkpoint\n"
        "cls = make_checkpoint(__import__('pathlib').Path(%r), %d, %d)\n"
        "t = time.perf_counter()\n"
        "with torch.device('meta'):\n    m = cls()\n"
        "m.load_state_dict(torch.load(%r, weights_only=True), assign=True)\n"
        "print(time.perf_counter() - t)\n"
    )
    return code % (str(Path(__file__).parent), str(path), layers, n, str(path))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--binary", help="a built burn_load_bench (default: cargo build --release)")
    a = p.parse_args()

    path = Path(tempfile.gettempdir()) / "torchport-bench" / f"linear{a.layers}x{a.n}.pt"
    make_checkpoint(path, a.layers, a.n)
    size = path.stat().st_size
    if a.binary:
        binary = Path(a.binary)
    else:
        subprocess.run(
            ["cargo", "build", "--release", "-p", "torchport-burn", "--example", "burn_load_bench"],
            cwd=ROOT, check=True,
        )
        binary = ROOT / "target" / "release" / "examples" / "burn_load_bench"
    with open(path, "rb") as f:  # warm the page cache
        while f.read(1 << 24):
            pass

    reads, loads, torches, last = [], [], [], {}
    code = torch_load_code(path, a.layers, a.n)
    for _ in range(a.runs):
        reads.append(run(binary, "read", path)["seconds"])
        last = run(binary, "load", path, a.layers, a.n)
        loads.append(last["seconds"])
        out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
        torches.append(float(out.stdout.strip().splitlines()[-1]))
    r, l, t = (statistics.median(x) for x in (reads, loads, torches))
    mib = 1 << 20
    print(f"file: {path} ({size / mib:.0f} MiB, {a.layers} x Linear({a.n}, {a.n}))")
    print(f"read once (std::fs::read)         {r:.3f} s  ({size / mib / r:.0f} MiB/s)")
    print(f"torchport-burn load (transposing) {l:.3f} s  ratio load/read = {l / r:.2f}")
    print(f"torch.load + load_state_dict      {t:.3f} s  ratio torch/read = {t / r:.2f}")
    print(
        f"load memory: peak RSS {last['peak_rss'] / mib:.0f} MiB, at the end anon "
        f"{last['rss_anon'] / mib:.0f} MiB + file-backed {last['rss_file'] / mib:.0f} MiB "
        f"(file {size / mib:.0f} MiB)"
    )
    print(f"runs: read {reads}, load {loads}, torch {torches}")


if __name__ == "__main__":
    main()
