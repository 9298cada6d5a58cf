"""TorchScript archives written by old torch versions, run by `torchport run`: torchvision's
models of that torch's day (its own widths, random weights with batch-norm statistics that
matter, one 64 x 64 image), traced and scripted where that torch can, an LSTM tagger and a
module with loops. Two steps, the first under the old torch (its own venv; see
tests/fixtures/gen/gen_torchscript_old.py for installing torch 1.4 / 1.8), the second with
the repo's venv:

    /tmp/venv-torch14/bin/python benches/ts_zoo_old.py write DIR
    /work/main/.venv/bin/python benches/ts_zoo_old.py check DIR [--bin target/release/torchport]

`write` saves DIR/<model>.<how>.pt, its input and that torch's outputs; `check` runs each
archive twice (`--runs 2`: the second run by the graph recorded from the first where the cell
says so) and compares the outputs as ts_zoo.py does (1e-4 * max(1, max|ref|), ints exactly).
"""

import subprocess
import sys
from pathlib import Path

import numpy as np


def write(out):
    import torch
    import torchvision
    from torch import nn

    out.mkdir(parents=True, exist_ok=True)
    tv = torchvision.models
    models = {
        "resnet18": lambda: tv.resnet18(num_classes=10),
        "mobilenet_v2": lambda: tv.mobilenet_v2(num_classes=10),
        "densenet121": lambda: tv.densenet121(num_classes=10),
        "shufflenet_v2_x0_5": lambda: tv.shufflenet_v2_x0_5(num_classes=10),
        "squeezenet1_1": lambda: tv.squeezenet1_1(num_classes=10),
        "googlenet": lambda: tv.googlenet(num_classes=10, aux_logits=False, init_weights=False),
        "mnasnet0_5": lambda: tv.mnasnet0_5(num_classes=10),
        "mobilenet_v3_small": lambda: tv.mobilenet_v3_small(num_classes=10),
    }

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests/fixtures/gen"))
    from gen_torchscript_old import Tagger  # the fixtures' tagger (its logits come first)

    def calibrated(m):
        g = torch.Generator().manual_seed(1)
        for mod in m.modules():
            if isinstance(mod, nn.Linear):
                mod.reset_parameters()
            if isinstance(mod, nn.modules.batchnorm._BatchNorm):
                n = mod.num_features
                mod.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
                mod.running_var.copy_(torch.rand(n, generator=g) + 0.5)
        return m

    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    cases = [(n, make, (x,)) for n, make in models.items()]
    cases.append(("lstm", Tagger, (torch.randint(0, 20, (2, 7)),)))
    print("torch", torch.__version__, "torchvision", torchvision.__version__)
    for name, make, inputs in cases:
        torch.manual_seed(0)
        try:
            m = make().eval()
        except AttributeError:
            print(f"{name}: not in this torchvision")
            continue
        with torch.no_grad():
            calibrated(m)
            for how in ("trace", "script"):
                try:
                    if how == "trace":
                        sm = torch.jit.trace(m, inputs, check_trace=False)
                    else:
                        sm = torch.jit.script(m)
                    y = sm(*inputs)
                    if isinstance(y, tuple):  # scripted GoogLeNet's, the tagger's: logits first
                        y = y[0]
                except Exception as e:  # noqa: BLE001 - torch's own failure is a result
                    print(f"{name}.{how}: torch failed ({type(e).__name__})")
                    continue
                stem = f"{name}.{how}"
                torch.jit.save(sm, str(out / f"{stem}.pt"))
                for i, t in enumerate(inputs):
                    np.save(str(out / f"{stem}.in{i}.npy"), t.numpy())
                np.save(str(out / f"{stem}.ref.npy"), y.numpy())
                print(f"{stem}: saved")


def check(d, binary):
    print(f"| archive | torchport ({d.name}) |\n|---|---|")
    for pt in sorted(d.glob("*.pt")):
        stem = pt.name[:-3]
        args = [binary, "run", str(pt)]
        for i in sorted(d.glob(stem + ".in*.npy")):
            args += ["--input", str(i)]
        args += ["--output", str(d / f"{stem}.out.npz"), "--runs", "2"]
        r = subprocess.run(args, capture_output=True, text=True)
        if r.returncode:
            print(f"| {stem} | error: {r.stderr.strip().splitlines()[-1]} |")
            continue
        got = np.load(d / f"{stem}.out.npz")["output_0"]
        ref = np.load(d / f"{stem}.ref.npy")
        how = "graph" if "recorded graph" in r.stderr else "interpreted"
        if got.shape != ref.shape:
            print(f"| {stem} | MISMATCH: shape {got.shape}, torch {ref.shape} |")
            continue
        err = float(np.abs(got.astype(np.float64) - ref).max())
        tol = 1e-4 * max(1.0, float(np.abs(ref).max()))
        verdict = "ok" if err <= tol else "MISMATCH"
        print(f"| {stem} | {verdict} ({err:.1e}; outputs up to {np.abs(ref).max():.1f}), {how} |")


if __name__ == "__main__":
    step, folder = sys.argv[1], Path(sys.argv[2])
    if step == "write":
        write(folder)
    else:
        root = Path(__file__).resolve().parents[1]
        b = sys.argv[sys.argv.index("--bin") + 1] if "--bin" in sys.argv else \
            str(root / "target/release/torchport")
        check(folder, b)
