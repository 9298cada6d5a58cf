"""TorchScript archives run by torchport against PyTorch (issue 14): each of run_bench.py's
models traced by `torch.jit.trace` and saved (`benches/out/NAME_bBATCH.ts.pt`, made on first
use), then timed in turns, run by run, on the same inputs and thread count: torchport's
TorchScript front end (`run_timing --serve` on the archive), the saved archive loaded back by
`torch.jit.load` (libtorch's TorchScript interpreter: what the archive's user would otherwise
ship), and the model in PyTorch eager (`inference_mode`). Prints each engine's median and the
medians of the per-turn ratios; torchport's output is checked against the archive's own in
torch first (`torchport run --runs 2`: the second run, by the graph recorded from the first,
as the timed runs are where the archive allows: docs/RUNTIME.md).

    cargo build --release -p torchport-runtime --example run_timing && cargo build --release -p torchport-cli
    /work/main/.venv/bin/python benches/ts_bench.py [--models a,b] [--threads 1,2] [--batch 1,8] [--runs 10]

The transformers models are traced through run_bench.py's keyword wrapper (their outputs as a
tuple).
"""

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_bench  # noqa: E402

CLI = run_bench.ROOT / "target/release/torchport"


def traced(name, batch):
    """(eager model, its inputs, the traced archive's path, the inputs' .npy paths)."""
    model, inputs, npys = run_bench.build(name, batch)
    path = run_bench.stem(name, batch).with_suffix(".ts.pt")
    if name in run_bench.KEYWORDS:
        model = run_bench.ByKeyword(model, run_bench.KEYWORDS[name]).eval()
    if not path.exists():
        with torch.no_grad():
            torch.jit.trace(model, inputs, strict=False).save(str(path))
    return model, inputs, path, npys


def turns(args, model, jit, inputs, path, npys, th):
    """(eager, torch.jit, torchport medians in ms; medians of the per-turn torchport / eager
    and torchport / torch.jit ratios; torchport's load ms)."""
    torch.set_num_threads(th)
    env = run_bench.run_timing_env(args, th)
    proc = subprocess.Popen([str(args.binary), str(path), *map(str, npys), "--serve"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    if proc.stdout.readline().strip() != "ready":
        sys.exit(f"{args.binary} --serve did not start on {path}")
    eager, tj, tp = [], [], []
    with torch.inference_mode():
        for _ in range(3):  # warm-up; TorchScript's executor optimizes on its first runs
            model(*inputs)
            jit(*inputs)
        for _ in range(args.runs):
            for engine, times in ((model, eager), (jit, tj)):
                t = time.perf_counter()
                engine(*inputs)
                times.append((time.perf_counter() - t) * 1e3)
                time.sleep(run_bench.PAUSE_S)
            proc.stdin.write("run\n")
            proc.stdin.flush()
            tp.append(float(proc.stdout.readline()))
            time.sleep(run_bench.PAUSE_S)
    proc.stdin.close()
    js = run_bench.json.loads(proc.stdout.read().strip().splitlines()[-1])
    proc.wait()
    med = statistics.median
    return (med(eager), med(tj), med(tp), med(a / b for a, b in zip(tp, eager)),
            med(a / b for a, b in zip(tp, tj)), js["load_ms"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(run_bench.MODELS))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--binary", type=Path, default=run_bench.TIMING)
    ap.add_argument("--pin", action="store_true", help="as run_bench.py's --pin")
    args = ap.parse_args()
    rows = []
    for name in args.models.split(","):
        for batch in map(int, args.batch.split(",")):
            try:
                model, inputs, path, npys = traced(name, batch)
            except Exception as e:  # a model torch cannot trace: say so, go on
                print(f"{name} b{batch}: torch.jit.trace failed: {type(e).__name__}: "
                      f"{str(e)[:160]}")
                continue
            jit = torch.jit.load(str(path)).eval()
            # torchport's first output against the archive's own in torch.
            print(f"{name} b{batch}: {run_bench.check(CLI, jit, inputs, path, npys, runs=2)}", flush=True)
            for th in map(int, args.threads.split(",")):
                e, j, t, re, rj, load = turns(args, model, jit, inputs, path, npys, th)
                print(f"{name} b{batch} t{th}: eager {e:.2f} torch.jit {j:.2f} torchport {t:.2f} "
                      f"ms; torchport / eager {re:.2f}, / torch.jit {rj:.2f}", flush=True)
                rows.append((name, batch, th, e, j, t, re, rj, load))
    print("\n| model | batch | threads | torch eager ms | torch.jit ms | torchport ms | "
          "torchport / eager | torchport / torch.jit | torchport load ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, b, th, e, j, t, re, rj, load in rows:
        print(f"| {name} | {b} | {th} | {e:.2f} | {j:.2f} | {t:.2f} | {re:.2f} | {rj:.2f} "
              f"| {load:.0f} |")


if __name__ == "__main__":
    main()
