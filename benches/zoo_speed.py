"""Speed across the real-model zoo (issue 14): each zoo export that torchport runs, timed by
torchport (`run_timing` on the plain export) and by PyTorch eager (the model `zoo.py` builds,
under `torch.inference_mode()`) on the same inputs and thread count, one engine after the
other, with the ratio printed. The issue's bench (`run_bench.py`) holds eight models to
eager's time; this looks for the models that fall off a fast path.

    cargo build --release -p torchport-runtime --example run_timing
    /work/main/.venv/bin/python benches/zoo.py --reuse        # the exports, once
    /work/main/.venv/bin/python benches/zoo_speed.py [--threads 1] [--runs 5] [--rounds 2] [NAME ...]

Each model is timed `--rounds` times, the engines alternating, and each engine's least
median is kept (other tenants of a shared machine only add time). Exports whose torchport
run failed in the zoo's last run (no `plain.out.npz`) are skipped. The rows are sorted by
the ratio, slowest first; `--json` also writes them.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_bench  # noqa: E402
import zoo  # noqa: E402


def eager_ms(model, args, kwargs, runs):
    """Median wall ms of the model's eager forward over `runs` after one warm-up."""
    with torch.inference_mode():
        return run_bench.time_it(lambda: model(*args, **kwargs), runs)[0]


def torchport_ms(args, d, n_in):
    """run_timing's JSON for the plain export of zoo folder `d`, or an error string; its
    environment as run_bench.py gives it (threads, --pin, this process's TORCHPORT_*)."""
    cmd = [str(args.binary), str(d / "plain.pt2"),
           *(str(d / f"input_{i}.npy") for i in range(n_in)), "--runs", str(args.runs)]
    env = run_bench.run_timing_env(args, args.threads)
    timeout = args.timeout
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout} s"
    if p.returncode != 0:
        return (p.stderr.strip().splitlines() or ["failed"])[-1][:200]
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*", help="zoo models (default: all exported)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--binary", type=Path, default=run_bench.TIMING,
                    help="run_timing executable (default: the release build of this checkout)")
    ap.add_argument("--pin", action="store_true",
                    help="torchport's pool threads bound one to a CPU (TORCHPORT_PIN_THREADS)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    if not args.binary.exists():
        sys.exit("build first: cargo build --release -p torchport-runtime --example run_timing")
    names = args.names or [n for n in zoo.MODELS if (zoo.DATA / n / "plain.out.npz").exists()]
    unknown = [n for n in names if n not in zoo.MODELS]
    if unknown:
        sys.exit(f"not zoo models: {', '.join(unknown)}")
    torch.set_num_threads(args.threads)
    print(f"{len(names)} models, {args.threads} threads, load average at start "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    rows = []
    for name in names:
        d = zoo.DATA / name
        if not (d / "plain.pt2").exists():
            print(f"{name}: not exported (run zoo.py first)", flush=True)
            continue
        model, inputs, _ = zoo.made(zoo.MODELS[name])
        a, kw = zoo.split(inputs)
        n_in = len(zoo.leaves((a, kw)))
        eager, tp, load, error = [], [], [], None
        for _ in range(args.rounds):
            eager.append(eager_ms(model, a, kw, args.runs))
            time.sleep(run_bench.PAUSE_S)
            js = torchport_ms(args, d, n_in)
            if isinstance(js, str):
                error = js
                break
            tp.append(js["median_ms"])
            load.append(js["load_ms"])
            time.sleep(run_bench.PAUSE_S)
        if error:
            print(f"{name}: torchport failed: {error}", flush=True)
            rows.append({"model": name, "error": error})
            continue
        row = {"model": name, "eager_ms": min(eager), "torchport_ms": min(tp),
               "load_ms": statistics.median(load)}
        row["ratio"] = row["torchport_ms"] / row["eager_ms"]
        rows.append(row)
        print(f"{name:40s} eager {row['eager_ms']:9.2f} ms  torchport {row['torchport_ms']:9.2f} "
              f"ms  x {row['ratio']:.2f}", flush=True)
        del model
    timed = sorted((r for r in rows if "ratio" in r), key=lambda r: -r["ratio"])
    ratios = [r["ratio"] for r in timed]
    print(f"\n{args.threads} threads, runs={args.runs}, rounds={args.rounds} (least median); "
          f"load average at end {os.getloadavg()[0]:.2f}")
    if ratios:
        print(f"{len(timed)} timed: torchport / eager median {statistics.median(ratios):.2f}, "
              f"range {min(ratios):.2f}-{max(ratios):.2f}; over 1.0: "
              f"{sum(r > 1.0 for r in ratios)}")
    print("| model | torch eager ms | torchport ms | torchport / eager | torchport load ms |")
    print("|---|---:|---:|---:|---:|")
    for r in timed:
        print(f"| {r['model']} | {r['eager_ms']:.2f} | {r['torchport_ms']:.2f} | "
              f"{r['ratio']:.2f} | {r['load_ms']:.0f} |")
    for r in rows:
        if "error" in r:
            print(f"| {r['model']} | | failed: {r['error']} | | |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
