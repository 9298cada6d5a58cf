"""Benchmark `torchport run` (the runtime, release build) against PyTorch eager and
onnxruntime on the same machine, same thread count, in one run; prints latency ratios.

    cargo build --release -p torchport-runtime --example run_timing
    /work/main/.venv/bin/python benches/run_bench.py [--threads 2] [--runs 10]

Models (made on demand under benches/out/, gitignored): ResNet-18 (full width) at 224x224,
batch 1; a BERT-base-shaped encoder (d=768, 12 heads, 12 layers, FFN 3072) at sequence 128;
a ViT-S/16-shaped model (d=384, 6 heads, 12 layers, scaled_dot_product_attention) at 224x224.
--binary picks another run_timing build (e.g. a copy of the one before a change).
Needs onnxruntime==1.31.1 and onnx in the venv.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/fixtures/gen"))
from export_models import BasicBlock, Bert, ViT  # noqa: E402

OUT = ROOT / "benches/out"
TIMING = ROOT / "target/release/examples/run_timing"


class ResNet18(nn.Module):
    def __init__(self, w=64, classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, w, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(w)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        layers, cin = [], w
        for i, c in enumerate([w, 2 * w, 4 * w, 8 * w]):
            layers += [BasicBlock(cin, c, 1 if i == 0 else 2), BasicBlock(c, c, 1)]
            cin = c
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.maxpool(torch.relu(self.bn1(self.conv1(x))))
        x = torch.nn.functional.adaptive_avg_pool2d(self.layers(x), 1)
        return self.fc(torch.flatten(x, 1))


def models():
    torch.manual_seed(0)
    r = ResNet18().eval()
    yield "resnet18", r, (torch.randn(1, 3, 224, 224),)
    b = Bert(vocab=30522, d=768, heads=12, layers=12, maxlen=512).eval()
    ids = torch.randint(0, 30522, (1, 128))
    yield "bert_base", b, (ids, torch.ones(1, 128, dtype=torch.int64))
    v = ViT(d=384, heads=6, layers=12, patch=16, img=224).eval()
    yield "vit_small", v, (torch.randn(1, 3, 224, 224),)


def time_it(fn, runs):
    fn()
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--binary", type=Path, default=TIMING,
                    help="run_timing executable (default: the release build of this checkout)")
    args = ap.parse_args()
    if not args.binary.exists():
        sys.exit(f"build first: cargo build --release -p torchport-runtime --example run_timing")
    import onnxruntime as ort

    torch.set_num_threads(args.threads)
    OUT.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, model, inputs in models():
        pt2 = OUT / f"{name}.pt2"
        onnx_path = OUT / f"{name}.onnx"
        npys = [OUT / f"{name}.input_{i}.npy" for i in range(len(inputs))]
        if not pt2.exists():
            torch.export.save(torch.export.export(model, inputs), pt2)
        if not onnx_path.exists():
            torch.onnx.export(model, inputs, onnx_path, dynamo=False, opset_version=17)
        for p, x in zip(npys, inputs):
            np.save(p, x.numpy())

        with torch.inference_mode():
            eager = time_it(lambda: model(*inputs), args.runs)
        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
        feed = {i.name: x.numpy() for i, x in zip(sess.get_inputs(), inputs)}
        onnx_ms = time_it(lambda: sess.run(None, feed), args.runs)
        env = {"RAYON_NUM_THREADS": str(args.threads), "PATH": "/usr/bin:/bin"}
        res = subprocess.run([str(args.binary), str(pt2), *map(str, npys), "--runs", str(args.runs)],
                             capture_output=True, text=True, env=env, check=True)
        tp = json.loads(res.stdout.strip().splitlines()[-1])
        rows.append((name, tp["median_ms"], eager, onnx_ms, tp["load_ms"]))

    print(f"threads={args.threads} runs={args.runs} (medians, ms)")
    print(f"{'model':<10} {'torchport':>10} {'torch':>10} {'ort':>10} {'tp/torch':>9} {'tp/ort':>8} {'tp load':>8}")
    for name, tp, eager, onnx_ms, load in rows:
        print(f"{name:<10} {tp:>10.1f} {eager:>10.1f} {onnx_ms:>10.1f} {tp / eager:>9.2f} {tp / onnx_ms:>8.2f} {load:>8.0f}")


if __name__ == "__main__":
    main()
