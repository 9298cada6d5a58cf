"""Single convolutions with the shapes of torchvision's ResNets (`nn.Conv2d` + `ReLU`, batch 1),
each exported alone, timed in torchport, PyTorch eager (`inference_mode`) and onnxruntime on
the same threads, one after another, with the ratios (issue 14). For finding which kind of
convolution keeps a CNN behind onnxruntime, without a whole model's noise: each engine's
least time over its runs.

    cargo build --release -p torchport-runtime --example run_timing
    /work/main/.venv/bin/python benches/conv_bench.py [--threads 1] [--runs 30] [--rounds 3]
        [--binary PATH] [--only stem,s2_128]

The exports go to benches/out/conv_NAME.{pt2,onnx,input_0.npy}, written on first use.
The engines take turns, --rounds times for each convolution; each one's time is its least:
over run_timing's --runs runs in one process a round (after its warm-up) for torchport, over
--runs calls after two warm-up calls a round for torch and onnxruntime.
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_bench  # noqa: E402  (paths, onnxruntime sessions, run_timing's environment)

# name: (in channels, out channels, kernel, stride, padding, input side)
CONVS = {
    "stem": (3, 64, 7, 2, 3, 224),
    "s1_64": (64, 64, 3, 1, 1, 56),
    "s2_128": (128, 128, 3, 2, 1, 56),
    "s2_256": (256, 256, 3, 2, 1, 28),
    "s1_512_7x7": (512, 512, 3, 1, 1, 7),
    "1x1_256_64": (256, 64, 1, 1, 0, 56),
    "1x1_128_512": (128, 512, 1, 1, 0, 28),
    "1x1_256_1024": (256, 1024, 1, 1, 0, 14),
    "1x1_1024_256": (1024, 256, 1, 1, 0, 14),
    "1x1_512_2048_7x7": (512, 2048, 1, 1, 0, 7),
    "1x1_2048_512_7x7": (2048, 512, 1, 1, 0, 7),
    "ds_1024_2048": (1024, 2048, 1, 2, 0, 14),
}


def export(name):
    """The conv's module, input and export paths, exported on first use."""
    ci, co, k, s, p, side = CONVS[name]
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(ci, co, k, s, p), torch.nn.ReLU()).eval()
    x = torch.randn(1, ci, side, side)
    stem = run_bench.OUT / f"conv_{name}"
    pt2, onnx, npy = (Path(f"{stem}.{ext}") for ext in ("pt2", "onnx", "input_0.npy"))
    if not (pt2.exists() and onnx.exists() and npy.exists()):
        run_bench.OUT.mkdir(parents=True, exist_ok=True)
        torch.export.save(torch.export.export(m, (x,)), pt2)
        torch.onnx.export(m, (x,), str(onnx), dynamo=False, opset_version=17)
        np.save(npy, x.numpy())
    # The same seed gives the exported weights again; the saved input, for every engine.
    return m, torch.from_numpy(np.load(npy)), pt2, onnx, npy


def least_ms(fn, runs):
    """The least wall time of `runs` calls of `fn`, in ms, after two warm-up calls."""
    fn()
    fn()
    best = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--binary", type=Path, default=run_bench.TIMING)
    ap.add_argument("--only", default="", help="comma-separated names (default: all)")
    ap.add_argument("--pin", action="store_true", help="TORCHPORT_PIN_THREADS=1")
    args = ap.parse_args()
    try:
        import onnxruntime as ort
    except ImportError:
        ort = None
    names = [n for n in args.only.split(",") if n] or list(CONVS)
    torch.set_num_threads(args.threads)
    print(f"threads {args.threads}, runs {args.runs}, rounds {args.rounds}, binary {args.binary}")
    print("| convolution | torch eager ms | onnxruntime ms | torchport ms | / eager | / onnxruntime |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in names:
        m, x, pt2, onnx, npy = export(name)
        sess, feed = run_bench.ort_session(ort, onnx, [x], args.threads)
        eager = ort_ms = tp = float("inf")
        # The engines in turn, --rounds times: a spell of the machine's falls on all three.
        for _ in range(args.rounds):
            with torch.inference_mode():
                eager = min(eager, least_ms(lambda: m(x), args.runs))
            if sess:
                ort_ms = min(ort_ms, least_ms(lambda: sess.run(None, feed), args.runs))
            out = subprocess.run(
                [str(args.binary), str(pt2), str(npy), "--runs", str(args.runs)],
                env=run_bench.run_timing_env(args, args.threads),
                capture_output=True, text=True, check=True)
            tp = min(tp, json.loads(out.stdout)["min_ms"])
        ort_ms = ort_ms if sess else float("nan")
        print(f"| {name} | {eager:.3f} | {ort_ms:.3f} | {tp:.3f} | {tp / eager:.2f} | "
              f"{tp / ort_ms:.2f} |", flush=True)


if __name__ == "__main__":
    main()
