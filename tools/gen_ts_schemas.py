"""Write crates/torchport-runtime/src/torchscript/schemas.txt: the schema of every
overload the runtime's op registry implements (and of its in-place twin), one per line, as
torch prints it: ATen's, and torchvision's detection operators. The TorchScript front end
binds the positional and keyword arguments of the serialized code to these schemas (TorchScript writes calls without overload names and without
argument names), then calls the registry's kernels with named arguments, as the `.pt2` path
does. Beside it, pointwise.txt: the names of those operators torch tags `pointwise` (their
results are laid out in memory by torch's elementwise machinery; torchscript/layouts.rs).
Run with the pinned venv after adding kernels:

    /work/main/.venv/bin/python tools/gen_ts_schemas.py
"""

import re
from pathlib import Path

import torch
import torchvision  # noqa: F401  (registers torch.ops.torchvision)

ROOT = Path(__file__).resolve().parents[1]
OPS = ROOT / "crates/torchport-runtime/src/ops"
OUT = ROOT / "crates/torchport-runtime/src/torchscript/schemas.txt"
POINTWISE = OUT.with_name("pointwise.txt")

# Overloads TorchScript emits that `.pt2` programs do not; the front end runs them with an
# existing kernel (see ALIASES in torchscript/aten.rs).
EXTRA = ["aten._convolution.default", "aten._convolution.deprecated", "aten.dropout.default", "aten.feature_dropout.default",
         "aten.contiguous.default", "aten.size.int", "aten.to.dtype", "aten.to.device",
         "aten.to.dtype_layout", "aten.to.other", "aten.view.default", "aten.reshape.default",
         "aten.expand_as.default", "aten.flatten.using_ints", "aten.softmax.int",
         "aten.log_softmax.int", "aten.mean.dim", "aten.sum.dim_IntList", "aten.rsub.Scalar",
         "aten.div.Tensor_mode", "aten.div.Scalar_mode", "aten.max.dim", "aten.min.dim",
         "aten.upsample_bilinear2d.vec", "aten.upsample_nearest2d.vec",
         "aten.instance_norm.default", "aten.hardtanh.default"]


def registered():
    names = set(EXTRA)
    for f in OPS.glob("*.rs"):
        names.update(re.findall(r'"((?:aten|torchvision)\.[A-Za-z0-9_]+\.[A-Za-z0-9_]+)"',
                                f.read_text()))
    return names


def main():
    lines = []
    pointwise = set()
    for key in sorted(registered()):
        ns, base, overload = key.split(".")
        for name in (base, base + "_"):
            packet = getattr(getattr(torch.ops, ns), name, None)
            if packet is None:
                continue
            ov = getattr(packet, overload, None)
            if ov is None:
                continue
            s = str(ov._schema)
            if "(a!)" in s and name == base:
                continue
            lines.append(s)
            if torch.Tag.pointwise in ov.tags and ns == "aten":
                pointwise.add(name)
    OUT.write_text("\n".join(sorted(set(lines))) + "\n")
    POINTWISE.write_text("\n".join(sorted(pointwise)) + "\n")
    print(f"{len(lines)} schemas, {OUT.stat().st_size} bytes; {len(pointwise)} pointwise")


if __name__ == "__main__":
    main()
