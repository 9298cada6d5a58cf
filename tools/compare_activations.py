#!/usr/bin/env python3
"""Compare two activation files layer by layer and point at the first layer that diverges.

    python tools/compare_activations.py TORCH.safetensors RUST.safetensors [--atol 1e-5] [--rtol 1e-4]

Walks the names in the recording order of the first file (its `torchport.order` metadata, as
written by tools/record_activations.py and by torchport_burn::Activations /
torchport_candle::Activations), compares every name both files have, prints one line per
layer (max abs diff, and the element where it is largest), and names the first layer whose
values are not close: |a - b| <= atol + rtol * |a| elementwise, as numpy.isclose.
Exit status: 0 when every shared layer is close and no layer is missing, 1 when they differ,
2 on error — the same contract as `torchport diff`.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from safetensors import safe_open


def read(path):
    try:
        with safe_open(path, framework="numpy") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # noqa: BLE001 - one clear line for any unreadable file
        print(f"error: {path}: {e}", file=sys.stderr)
        sys.exit(2)
    order = [n for n in meta.get("torchport.order", "").split(",") if n]
    order += sorted(k for k in tensors if k not in order)
    return tensors, order


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--atol", type=float, default=1e-5)
    p.add_argument("--rtol", type=float, default=1e-4)
    args = p.parse_args(argv)
    a, order = read(args.a)
    b, _ = read(args.b)
    first_bad = None
    missing = [n for n in order if n not in b]
    for name in order:
        if name not in b:
            continue
        x, y = a[name].astype(np.float64), b[name].astype(np.float64)
        if x.shape != y.shape:
            print(f"  {name:32s} shape {list(x.shape)} vs {list(y.shape)}")
            first_bad = first_bad or name
            continue
        d = np.abs(x - y)
        close = bool(np.all(d <= args.atol + args.rtol * np.abs(x)))
        where = np.unravel_index(int(np.argmax(d)), d.shape) if d.size else ()
        mark = "ok " if close else "BAD"
        print(f"{mark} {name:32s} max abs diff {float(d.max()) if d.size else 0.0:.3e} at {list(map(int, where))}")
        if not close and first_bad is None:
            first_bad = name
    for name in missing:
        print(f"  {name:32s} only in {args.a}")
    if first_bad is not None:
        print(f"first layer that diverges: {first_bad}")
        return 1
    if missing:
        return 1
    print("every shared layer is close")
    return 0


if __name__ == "__main__":
    sys.exit(main())
