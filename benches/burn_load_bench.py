#!/usr/bin/env python3
"""Loading a >= 512 MiB checkpoint into a Burn model: torchport against burn-store's own reader.

    /work/main/.venv/bin/python benches/burn_load_bench.py [--runs 5] [--layers 8] [--n 4096]

Writes (once) two state_dicts with torch.save into $TMPDIR/torchport-bench/: LAYERS
nn.Linear(N, N) and LAYERS nn.Embedding(N, N) (same bytes; Linear weights must be transposed
into Burn's [in, out], Embedding weights are taken as they are). Builds the Rust example
`burn_load_bench` in release mode, then, RUNS times and each in a fresh process:
    read        std::fs::read of the whole file — the baseline, "reading the file once"
    torchport   torchport_burn::TorchportStore::open(file).load(model) into the Burn model
    burn-store  burn-store's PytorchStore::from_file(file) + model.load_from, the same model
    torch       torch.load + load_state_dict(assign=True) into the PyTorch model, for reference
once with the file in the page cache (warm) and once with this file's pages dropped from the
cache first (cold: posix_fadvise(DONTNEED) on the file alone, nothing else is touched).
Prints medians, the ratios, and each loader's memory: peak resident set (VmHWM: heap and
memory-mapped file pages together), and with the model loaded its anonymous (heap) and
file-backed (memory map) parts. The model itself is LAYERS * N * N * 4 bytes; Burn builds it
lazily, so no random weights are ever allocated.
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
    times = {"read": [], "load": [], "burn-store": [], "torch": []}
    mem = {}
    for _ in range(runs):
        prepare(path)
        times["read"].append(run(binary, "read", path)["seconds"])
        for mode in ("load", "burn-store"):
            prepare(path)
            m = run(binary, mode, path, layers, n, kind)
            times[mode].append(m["seconds"])
            mem.setdefault(mode, []).append(m)
        prepare(path)
        times["torch"].append(torch_seconds(path, layers, n, kind))
    med = {k: statistics.median(v) for k, v in times.items()}
    peak = {k: statistics.median(x["peak_rss"] for x in v) for k, v in mem.items()}
    r, l, b, t = med["read"], med["load"], med["burn-store"], med["torch"]
    cache = "cold" if cold else "warm"
    print(f"{kind:9s} {cache}: read {r:.3f} s | torchport {l:.3f} s (x{l / r:.2f} of read) | "
          f"burn-store {b:.3f} s (x{b / r:.2f}) | torch.load {t:.3f} s (x{t / r:.2f})")
    print(f"          time torchport/burn-store x{l / b:.2f}; peak RSS torchport "
          f"{peak['load'] / MIB:.0f} MiB, burn-store {peak['burn-store'] / MIB:.0f} MiB "
          f"(x{peak['load'] / peak['burn-store']:.2f})")
    for mode, name in (("load", "torchport"), ("burn-store", "burn-store")):
        last = mem[mode][-1]
        print(f"          {name:10s} with the model loaded: anon {last['rss_anon'] / MIB:.0f} MiB, "
              f"file-backed {last['rss_file'] / MIB:.0f} MiB; peaks "
              f"{[round(x['peak_rss'] / MIB) for x in mem[mode]]} MiB")
    print(f"          runs (s): " + "; ".join(
        f"{k} {[round(x, 3) for x in v]}" for k, v in times.items()))


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
        target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
        binary = target / "release" / "examples" / "burn_load_bench"
    threads = len(os.sched_getaffinity(0))
    print(f"{threads} cores available (torchport transposes large float32 matrices on up to "
          f"min(cores, 8) threads)")
    for kind in a.kind or ["linear", "embedding"]:
        path = Path(tempfile.gettempdir()) / "torchport-bench" / f"{kind}{a.layers}x{a.n}.pt"
        make_checkpoint(path, a.layers, a.n, kind)
        print(f"{path} ({path.stat().st_size / MIB:.0f} MiB, {a.layers} x {kind}({a.n}, {a.n}))")
        for cold in (False, True):
            bench(binary, path, a.layers, a.n, kind, a.runs, cold)


if __name__ == "__main__":
    main()
