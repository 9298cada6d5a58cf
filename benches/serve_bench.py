"""Throughput of one loaded program served from N threads at once: torchport's runtime
(`Program` shared by N threads, examples/serve_throughput.rs) against PyTorch (the same
`.pt2` loaded with torch.export.load, its module called from N Python threads under
torch.inference_mode()), on the same machine in one run; prints runs/s and the ratio.

    cargo build --release -p torchport-runtime --example serve_throughput
    /work/main/.venv/bin/python benches/serve_bench.py [--threads 1,2,16] [--seconds 3]
        [--model tests/fixtures/export/regnet.plain.pt2]

Both sides use one thread inside each operator (RAYON_NUM_THREADS=1,
torch.set_num_threads(1)), so the serving threads are the only parallelism. Inputs are the
model's committed `.input_*.npy`. --binary picks another build (e.g. target/debug/..., where
the runtime and candle are still optimized).
"""

import argparse
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]


def inputs_of(model: Path):
    stem = str(model).rsplit(".", 2)[0]
    paths = []
    i = 0
    while Path(f"{stem}.input_{i}.npy").exists():
        paths.append(Path(f"{stem}.input_{i}.npy"))
        i += 1
    return paths


def torch_throughput(model: Path, inputs, n: int, seconds: float) -> float:
    torch.set_num_threads(1)
    module = torch.export.load(str(model)).module()
    args = [torch.from_numpy(np.load(p)) for p in inputs]
    with torch.inference_mode():
        module(*args)
    stop = threading.Event()
    counts = [0] * n

    def serve(k):
        with torch.inference_mode():
            while not stop.is_set():
                module(*args)
                counts[k] += 1

    threads = [threading.Thread(target=serve, args=(k,)) for k in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2,16")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--model", default="tests/fixtures/export/regnet.plain.pt2")
    ap.add_argument("--binary", default="target/release/examples/serve_throughput")
    a = ap.parse_args()
    model = ROOT / a.model
    inputs = inputs_of(model)
    env = dict(os.environ, RAYON_NUM_THREADS="1")
    out = subprocess.run(
        [str(ROOT / a.binary), str(model), *map(str, inputs), "--threads", a.threads,
         "--seconds", str(a.seconds)],
        check=True, capture_output=True, text=True, env=env,
    ).stdout
    ours = {r["threads"]: r["runs_per_s"] for r in map(json.loads, out.splitlines())}
    print(f"model {a.model}, {os.cpu_count()} CPUs, torch {torch.__version__}")
    print(f"{'threads':>7} {'torchport runs/s':>17} {'torch runs/s':>13} {'ratio':>6}")
    for n in map(int, a.threads.split(",")):
        theirs = torch_throughput(model, inputs, n, a.seconds)
        print(f"{n:>7} {ours[n]:>17.1f} {theirs:>13.1f} {ours[n] / theirs:>6.2f}")


if __name__ == "__main__":
    main()
