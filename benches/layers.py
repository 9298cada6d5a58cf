"""Where each engine spends a run, layer by layer: the slowest operator calls of torch eager
(torch.profiler, grouped by input shapes), of torchport (run_timing's node profile) and of
onnxruntime (its own profiler), for the same export, batch and thread count, one after
another. For finding which layers of a model stop scaling with threads (issue 14); the
lists are not matched to each other (the engines name and fuse their nodes differently), but
the shapes say which layer each line is.

    cargo build --release -p torchport-runtime --example run_timing
    python benches/layers.py [--models resnet18] [--batch 1] [--threads 1,16] [--top 12]

The exports are benches/run_bench.py's (benches/out/NAME_bB.pt2, .onnx and inputs), written
on first use. Each engine runs --runs times after two warm-up runs; each line is the mean
time per run of that operator and shape (torch, onnxruntime: the median for one node) or the
node's least time over the runs (torchport). Given more than one thread count, it ends with
torchport's nodes that gain least from the fewest threads to the most: each node's time
lost against a split that many times faster, largest first.
"""

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_bench  # noqa: E402


def torch_layers(model, inputs, threads, runs, top):
    torch.set_num_threads(threads)
    with torch.inference_mode():
        for _ in range(2):
            model(*inputs)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    record_shapes=True) as prof:
            for _ in range(runs):
                model(*inputs)
    # Top-level operator calls only (a conv2d's convolution and mkldnn calls are inside it).
    rows = collections.defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.cpu_parent is not None or not e.name.startswith("aten::"):
            continue
        shapes = [s for s in e.input_shapes if s][:2]
        key = (e.name, str(shapes))
        rows[key][0] += e.cpu_time_total / 1e3
        rows[key][1] += 1
    total = sum(v[0] for v in rows.values()) / runs
    print(f"  torch eager: {total:.2f} ms a run in top-level operators")
    for (name, shapes), (ms, count) in sorted(rows.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"  {ms / runs:9.3f} ms {count // runs:3}x  {name} {shapes}")


# A node line of run_timing's profile: time, node, target, output shape.
NODE_LINE = re.compile(r"\s*([\d.]+) ms  (\S+) (\S+) (\[.*\])$")


def torchport_layers(args, pt2, npys, threads, top):
    """Print torchport's slowest operators and nodes; return every node's least time (ms),
    target and output shape, by node name."""
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), TORCHPORT_PROFILE=str(args.runs),
               TORCHPORT_PROFILE_NODES="1000000")
    r = subprocess.run([str(args.binary), str(pt2), *map(str, npys), "--runs", "3"], env=env,
                       capture_output=True, text=True)
    lines = (r.stdout + r.stderr).strip().splitlines()
    print("  torchport:")
    nodes = {}
    for line in lines:
        m = NODE_LINE.match(line)
        if m:
            if len(nodes) < top:
                print("  " + line)
            nodes[m.group(2)] = (float(m.group(1)), m.group(3), m.group(4))
        else:
            print("  " + line)
    return nodes


def scaling(few, many, fewest, most, top):
    """The torchport nodes that gain least from `fewest` to `most` threads: each node's time
    on both, its speed-up, and the time it loses against a split `most / fewest` times
    faster, largest loss first."""
    rows = []
    for name, (t0, target, shape) in few.items():
        if name in many:
            t1 = many[name][0]
            rows.append((t1 - t0 * fewest / most, name, t0, t1, target, shape))
    lost = sum(r[0] for r in rows)
    print(f"== torchport from {fewest} to {most} threads: {sum(r[2] for r in rows):.2f} -> "
          f"{sum(r[3] for r in rows):.2f} ms in nodes, {lost:.2f} ms over a perfect split")
    for loss, name, t0, t1, target, shape in sorted(rows, reverse=True)[:top]:
        speedup = t0 / t1 if t1 > 0 else float("inf")
        print(f"  {loss:8.3f} ms lost  {t0:8.3f} -> {t1:8.3f} ms (x{speedup:5.2f})  {name} "
              f"{target} {shape}")


def ort_layers(onnx_path, inputs, threads, runs, top):
    try:
        import onnxruntime as ort
    except ImportError:
        print("  onnxruntime: not installed")
        return
    if not onnx_path.exists():
        print("  onnxruntime: no export")
        return
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.enable_profiling = True
    so.profile_file_prefix = str(Path(tempfile.gettempdir()) / "layers_ort")
    s = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
    feed = {i.name: x.numpy() for i, x in zip(s.get_inputs(), inputs)}
    for _ in range(2):
        s.run(None, feed)
    for _ in range(runs):
        s.run(None, feed)
    path = Path(s.end_profiling())
    events = json.loads(path.read_text())
    path.unlink()
    per = collections.defaultdict(list)
    ops = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            node = e["name"][: -len("_kernel_time")]
            per[node].append(e["dur"] / 1e3)
            ops[node] = (e["args"].get("op_name"), e["args"].get("output_type_shape"))
    med = {n: sorted(v)[len(v) // 2] for n, v in per.items()}
    print(f"  onnxruntime: {sum(med.values()):.2f} ms a run in nodes")
    for node, ms in sorted(med.items(), key=lambda kv: -kv[1])[:top]:
        op, shape = ops[node]
        print(f"  {ms:9.3f} ms  {node} {op} {json.dumps(shape)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet18")
    ap.add_argument("--batch", default="1")
    ap.add_argument("--threads", default="1,16")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--binary", type=Path, default=run_bench.TIMING)
    args = ap.parse_args()
    for name in args.models.split(","):
        for batch in map(int, args.batch.split(",")):
            run_bench.OUT.mkdir(parents=True, exist_ok=True)
            model, inputs, pt2, npys = run_bench.export(name, batch)
            onnx_path = pt2.with_suffix(".onnx")
            if not onnx_path.exists():
                m = (run_bench.ByKeyword(model, run_bench.KEYWORDS[name])
                     if name in run_bench.KEYWORDS else model)
                run_bench.export_onnx(name, m, inputs, onnx_path)
            threads = list(map(int, args.threads.split(",")))
            nodes = {}
            for th in threads:
                print(f"== {name} batch {batch}, {th} threads", flush=True)
                torch_layers(model, inputs, th, args.runs, args.top)
                ort_layers(onnx_path, inputs, th, args.runs, args.top)
                nodes[th] = torchport_layers(args, pt2, npys, th, args.top)
            lo, hi = min(threads), max(threads)
            if lo < hi:
                scaling(nodes[lo], nodes[hi], lo, hi, args.top)


if __name__ == "__main__":
    main()
