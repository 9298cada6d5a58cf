"""Load time and peak memory of torchport (the runtime, release build) against the time to
read the archive from a warm page cache and against PyTorch eager's peak memory, on the
libraries' own models of benches/run_bench.py (issue 14), in one run.

    cargo build --release -p torchport-runtime --example run_timing
    /work/main/.venv/bin/python benches/load_bench.py [--models resnet18,bert_base]
        [--threads 1] [--repeats 3] [--runs 3] [--loads 3] [--binary PATH] [--json OUT.json]

Per model (batch 1, exported once under benches/out/ by run_bench.py's `export`):
- read: the time to read the whole .pt2 archive (weights and program) from a warm page cache,
  as `cat FILE > /dev/null` does (run_timing's read_ms, measured in the same process just
  before the load), and the archive's size;
- read fresh: the time `std::fs::read` takes for the same file (into newly allocated memory,
  which the kernel maps page by page, as it must for the weights a load keeps; run_timing's
  read_fresh_ms, measured after the runs);
- load: `Program::load`'s wall time and CPU time (median over --repeats processes), and
  load / read, the issue's ratio (goal: <= 2);
- load again: the least of --loads - 1 more loads in the same process after the program is
  dropped (median over the processes), which write the memory the first load freed instead
  of fresh pages: the loader's own cost without the first touch of new memory, which on a
  VM that hands freed memory back to its host can cost ten times more (BENCHMARKS.md);
- peak RSS: torchport's resident-memory peak (VmHWM) over a process that loads the program
  and runs it 1 + --runs times, and its resident memory right after the load; PyTorch's peak
  (ru_maxrss) over a process that imports torch, builds the same model with the library and
  runs it 1 + --runs times under `torch.inference_mode` (both at --threads threads), and the
  ratio torchport / torch (goal: <= 1).
--binary picks another run_timing build (e.g. a copy of the one before a change).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_bench  # noqa: E402  (the models and their exports)

EAGER = """
import resource, sys, torch
sys.path.insert(0, {bench!r})
import run_bench
torch.set_num_threads({threads})
torch.manual_seed(0)
model, inputs = run_bench.MODELS[{name!r}](1)
model.eval()
with torch.inference_mode():
    for _ in range(1 + {runs}):
        model(*inputs)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3 * 1.024)
"""


def torchport(binary, pt2, npys, threads, runs, loads):
    env = {"RAYON_NUM_THREADS": str(threads), "PATH": "/usr/bin:/bin"}
    extra = ["--loads", str(loads)] if loads > 1 else []
    res = subprocess.run([str(binary), str(pt2), *map(str, npys), "--runs", str(runs), *extra],
                         capture_output=True, text=True, env=env, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def eager_peak_mb(name, threads, runs):
    code = EAGER.format(bench=str(Path(__file__).resolve().parent), threads=threads,
                        name=name, runs=runs)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    return float(res.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(run_bench.MODELS),
                    help="comma-separated, of: " + ", ".join(run_bench.MODELS))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="torchport processes per model")
    ap.add_argument("--runs", type=int, default=3, help="runs after the warm-up run")
    ap.add_argument("--loads", type=int, default=3,
                    help="loads per process: the first, then again into the memory it freed")
    ap.add_argument("--binary", type=Path, default=run_bench.TIMING)
    ap.add_argument("--no-torch", action="store_true", help="skip PyTorch's peak RSS")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    if not args.binary.exists():
        sys.exit("build first: cargo build --release -p torchport-runtime --example run_timing")
    run_bench.OUT.mkdir(parents=True, exist_ok=True)
    print(f"load average at start: {os.getloadavg()[0]:.2f}; threads {args.threads}; "
          f"binary {args.binary}", flush=True)
    rows = []
    for name in args.models.split(","):
        _, _, pt2, npys = run_bench.export(name, 1)
        tps = [torchport(args.binary, pt2, npys, args.threads, args.runs, args.loads)
               for _ in range(args.repeats)]
        # (an older run_timing may lack a field: NaN)
        med = lambda k: statistics.median(t.get(k, float("nan")) for t in tps)  # noqa: E731
        row = dict(model=name, file_mb=tps[0]["file_mb"], read_ms=med("read_ms"),
                   read_fresh_ms=med("read_fresh_ms"),
                   load_ms=med("load_ms"), load_cpu_ms=med("load_cpu_ms"),
                   load_again_ms=med("load_again_ms"),
                   load_rss_mb=med("load_rss_mb"), peak_rss_mb=med("peak_rss_mb"),
                   loads_ms=[t["load_ms"] for t in tps])
        row["torch_peak_mb"] = (None if args.no_torch
                                else eager_peak_mb(name, args.threads, args.runs))
        rows.append(row)
        tpk = row["torch_peak_mb"]
        print(f"{name:<19} {row['file_mb']:7.1f} MB  read {row['read_ms']:7.1f} ms  "
              f"fresh {row['read_fresh_ms']:7.1f} ms  "
              f"load {row['load_ms']:7.1f} ms (cpu {row['load_cpu_ms']:6.0f}) "
              f"x{row['load_ms'] / row['read_ms']:5.2f}  again {row['load_again_ms']:7.1f} ms  "
              f"rss load {row['load_rss_mb']:6.0f} "
              f"peak {row['peak_rss_mb']:6.0f} MB  torch {tpk or float('nan'):6.0f} MB  "
              f"loads {' '.join(f'{v:.0f}' for v in row['loads_ms'])}", flush=True)
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")
    print("| model | archive MB | read (warm cache) ms | read into new memory ms "
          "| torchport load ms | load CPU ms | load / read | load / read into new memory "
          "| load again ms | again / read "
          "| RSS after load MB | torchport peak RSS MB | torch eager peak RSS MB "
          "| peak / torch |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        tpk = r["torch_peak_mb"]
        ratio = f"{r['peak_rss_mb'] / tpk:.2f}" if tpk else "-"
        print(f"| {r['model']} | {r['file_mb']:.0f} | {r['read_ms']:.1f} | "
              f"{r['read_fresh_ms']:.1f} | {r['load_ms']:.0f} | {r['load_cpu_ms']:.0f} | "
              f"{r['load_ms'] / r['read_ms']:.2f} | {r['load_ms'] / r['read_fresh_ms']:.2f} | "
              f"{r['load_again_ms']:.1f} | {r['load_again_ms'] / r['read_ms']:.2f} | "
              f"{r['load_rss_mb']:.0f} | {r['peak_rss_mb']:.0f} | "
              f"{tpk if tpk is None else round(tpk)} | {ratio} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
