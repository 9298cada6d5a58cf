"""More real models through the TorchScript front end than CI holds: each model is built by
torchvision, timm or transformers (random weights, small inputs), saved with torch.jit.trace
and torch.jit.script (where torch can), run by `torchport run` on the saved archive, and
compared with PyTorch's outputs of the saved module (1e-4 * max(1, max|ref|), ints exactly).
Prints one row per model and way of saving: ok (max abs error), the error torchport gave
(file, line, construct), or torch's own failure.

    /work/main/.venv/bin/python benches/ts_zoo.py [--bin PATH] [--out DIR] [--runs N] [NAME ...]

--bin defaults to target/release/torchport; --out (archives and arrays) to a temp folder.
--runs (default 2): `torchport run --runs N`, whose last run's outputs are compared; a
TorchScript archive's runs after the first go through the graph recorded from the first
where the run allows it (docs/RUNTIME.md), and the cell says which ("graph" or
"interpreted"). --runs 1 checks the interpreter alone.
"""

import argparse
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

warnings.filterwarnings("ignore")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/fixtures/gen"))
from gen_torchscript import flat_outputs  # noqa: E402
from gen_zoo import randomize_norm_stats  # noqa: E402


def img(s=64):
    return (torch.randn(1, 3, s, s),)


def tv(name, s=64, **kw):
    def make():
        import torchvision
        return torchvision.models.get_model(name, weights=None, **kw), img(s)
    return make


def timm_m(name, s=64, **kw):
    def make():
        import timm
        return timm.create_model(name, pretrained=False, **kw), img(s)
    return make


def hf(cls, cfgcls, **kw):
    def make():
        import transformers as T
        cfg = getattr(T, cfgcls)(torchscript=True, **kw)
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, 100, (2, 12), generator=g)
        mask = torch.ones(2, 12, dtype=torch.long)
        mask[1, 8:] = 0
        return getattr(T, cls)(cfg), (ids, mask)
    return make


MODELS = {
    "tv_resnet18": tv("resnet18", num_classes=10),
    "tv_resnext50_32x4d": tv("resnext50_32x4d", num_classes=10),
    "tv_squeezenet1_0": tv("squeezenet1_0", num_classes=10),
    "tv_shufflenet_v2_x0_5": tv("shufflenet_v2_x0_5", num_classes=10),
    "tv_mnasnet0_5": tv("mnasnet0_5", num_classes=10),
    "tv_efficientnet_b0": tv("efficientnet_b0", num_classes=10),
    "tv_convnext_tiny": tv("convnext_tiny", num_classes=10),
    "tv_regnet_y_400mf": tv("regnet_y_400mf", num_classes=10),
    "tv_densenet121": tv("densenet121", num_classes=10),
    "tv_mobilenet_v2": tv("mobilenet_v2", num_classes=10),
    "tv_googlenet": tv("googlenet", num_classes=10, aux_logits=False, init_weights=False),
    "tv_vit_b_16": tv("vit_b_16", s=32, image_size=32, num_classes=10),
    "tv_swin_t": tv("swin_t", num_classes=10),
    "tv_deeplabv3_mobilenet_v3_large": tv("deeplabv3_mobilenet_v3_large", weights_backbone=None,
                                          num_classes=3),
    "timm_convnext_atto": timm_m("convnext_atto", num_classes=10),
    "timm_efficientnet_b0": timm_m("efficientnet_b0", num_classes=10),
    "timm_deit_tiny": timm_m("deit_tiny_patch16_224", s=32, img_size=32, num_classes=10),
    "hf_distilbert": hf("DistilBertModel", "DistilBertConfig", vocab_size=100, dim=32,
                        n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=32),
    "hf_gpt2": hf("GPT2Model", "GPT2Config", vocab_size=100, n_embd=32, n_layer=2, n_head=2,
                  n_positions=32, use_cache=False),
}


def compare(got, ref):
    if len(got) != len(ref):
        return f"{len(got)} outputs, torch {len(ref)}"
    worst, ok = 0.0, True
    for g, w in zip(got, ref):
        w = w.numpy()
        if g.shape != w.shape:
            return f"shape {g.shape}, torch {w.shape}"
        if w.dtype.kind == "f":
            d = float(np.abs(g.astype(np.float64) - w).max()) if w.size else 0.0
            worst = max(worst, d)
            ok &= d <= 1e-4 * max(1.0, float(np.abs(w).max()) if w.size else 1.0)
        else:
            ok &= bool((g.astype(np.int64) == w.astype(np.int64)).all())
    return f"ok ({worst:.1e})" if ok else f"MISMATCH ({worst:.1e})"


def one(name, make, how, out, binary, runs):
    torch.manual_seed(0)
    try:
        m, inputs = make()
        m.eval()
        with torch.no_grad():
            randomize_norm_stats(m)
            sm = torch.jit.trace(m, inputs, strict=False) if how == "trace" else torch.jit.script(m)
            ref = flat_outputs(sm(*inputs))
    except Exception as e:  # noqa: BLE001 - torch's own failure is a result here
        return f"torch failed ({type(e).__name__}: {str(e).splitlines()[0][:80]})"
    p = out / f"{name}.{how}.pt"
    torch.jit.save(sm, p)
    args = [str(binary), "run", str(p)]
    for i, x in enumerate(inputs):
        np.save(out / f"{name}.in{i}.npy", x.numpy())
        args += ["--input", str(out / f"{name}.in{i}.npy")]
    args += ["--output", str(out / f"{name}.{how}.out.npz"), "--runs", str(runs)]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        return "error: " + r.stderr.strip().splitlines()[-1].replace(str(out) + "/", "")
    z = np.load(out / f"{name}.{how}.out.npz")
    verdict = compare([z[f"output_{i}"] for i in range(len(z.files))], ref)
    if runs > 1:
        # Runs after the first go through the recorded graph where the CLI says so.
        verdict += ", graph" if "recorded graph" in r.stderr else ", interpreted"
    return verdict


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(ROOT / "target/release/torchport"))
    ap.add_argument("--out")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("names", nargs="*")
    a = ap.parse_args()
    out = Path(a.out or tempfile.mkdtemp(prefix="ts_zoo_"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"TorchScript zoo (torch {torch.__version__}), `{Path(a.bin).name} run`:\n")
    print("| model | traced | scripted |\n|---|---|---|")
    for name, make in MODELS.items():
        if a.names and name not in a.names:
            continue
        cells = [one(name, make, how, out, a.bin, a.runs) for how in ("trace", "script")]
        print(f"| {name} | {cells[0]} | {cells[1]} |", flush=True)


if __name__ == "__main__":
    main()
