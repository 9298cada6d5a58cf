#!/usr/bin/env python3
"""Loading a ~512 MiB checkpoint into a Burn model, against reading the file once.

    /work/main/.venv/bin/python benches/burn_load_bench.py [--runs 5] [--layers 8] [--n 4096]

Writes (once) two state_dicts with torch.save into $TMPDIR/torchport-bench/: LAYERS
nn.Linear(N, N) and LAYERS nn.Embedding(N, N) (same bytes; Linear weights must be transposed
into Burn's [in, out], Embedding weights are taken as they are). Builds the Rust example
`burn_load_bench` in release mode, then, RUNS times and each in a fresh process:
    read    std::fs::read of the whole file — the baseline, "reading the file once"
    load    torchport_burn::TorchportStore::open(file).load(model) into the Burn model
    torch   torch.load + load_state_dict(assign=True) into the PyTorch model, for reference
once with the file in the page cache (warm) and once with this file's pages dropped from the
cache first (cold: posix_fadvise(DONTNEED) on the file alone, nothing else is touched).
Prints medians, the ratio load/read, and the loading process's memory: peak resident set, and
with the model loaded its anonymous (heap) and file-backed (memory map) parts — a full
in-memory copy of the file would show as anonymous memory of about twice the file size.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20


def make_checkpoint(path: Path, layers: int, n: int, kind: str = "linear"):
    import torch

    class Stack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            make = (lambda: torch.nn.Linear(n, n)) if kind == "linear" else (
                lambda: torch.nn.Embedding(n, n))
            self.layers = torch.nn.ModuleList(make() for _ in range(layers))

    if not path.exists():
        torch.manual_seed(0)
        path.parent.mkdir(parents=True, exist_ok=True)
        with torch.no_grad():
            m = Stack()
        torch.save(m.state_dict(), path)
    return Stack


def drop_cache(path: Path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def warm_cache(path: Path):
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


def run(binary: Path, *args) -> dict:
    out = subprocess.run([str(binary), *map(str, args)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def torch_seconds(path: Path, layers: int, n: int, kind: str) -> float:
    code = (
        "import sys, time, torch\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from burn_load_bench import make_checkpoint\n"
        f"cls = make_checkpoint(__import__('pathlib').Path({str(path)!r}), {layers}, {n}, {kind!r})\n"
        "t = time.perf_counter()\n"
        "with torch.device('meta'):\n    m = cls()\n"
        f"m.load_state_dict(torch.load({str(path)!r}, weights_only=True), assign=True)\n"
        "print(time.perf_counter() - t)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def bench(binary: Path, path: Path, layers: int, n: int, kind: str, runs: int, cold: bool):
    prepare = drop_cache if cold else warm_cache
    reads, loads, torches, mem = [], [], [], {}
    for _ in range(runs):
        prepare(path)
        reads.append(run(binary, "read", path)["seconds"])
        prepare(path)
        mem = run(binary, "load", path, layers, n, kind)
        loads.append(mem["seconds"])
        prepare(path)
        torches.append(torch_seconds(path, layers, n, kind))
    r, l, t = (statistics.median(x) for x in (reads, loads, torches))
    cache = "cold" if cold else "warm"
    print(f"{kind:9s} {cache}: read {r:.3f} s | torchport-burn load {l:.3f} s "
          f"(x{l / r:.2f} of read) | torch.load {t:.3f} s (x{t / r:.2f})")
    print(f"          memory with the model loaded: peak RSS {mem['peak_rss'] / MIB:.0f} MiB, "
          f"anon {mem['rss_anon'] / MIB:.0f} MiB, file-backed {mem['rss_file'] / MIB:.0f} MiB")
    print(f"          runs: read {reads}, load {loads}, torch {[round(x, 4) for x in torches]}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--binary", help="a built burn_load_bench (default: cargo build --release)")
    p.add_argument("--kind", choices=["linear", "embedding"], action="append",
                   help="only this model (repeatable; default both)")
    a = p.parse_args()

    if a.binary:
        binary = Path(a.binary)
    else:
        subprocess.run(
            ["cargo", "build", "--release", "-p", "torchport-burn", "--example", "burn_load_bench"],
            cwd=ROOT, check=True,
        )
        binary = ROOT / "target" / "release" / "examples" / "burn_load_bench"
    for kind in a.kind or ["linear", "embedding"]:
        path = Path(tempfile.gettempdir()) / "torchport-bench" / f"{kind}{a.layers}x{a.n}.pt"
        make_checkpoint(path, a.layers, a.n, kind)
        print(f"{path} ({path.stat().st_size / MIB:.0f} MiB, {a.layers} x {kind}({a.n}, {a.n}))")
        for cold in (False, True):
            bench(binary, path, a.layers, a.n, kind, a.runs, cold)


if __name__ == "__main__":
    main()
