"""More real models through the TorchScript front end than CI holds: each model is built by
torchvision, timm or transformers (random weights, small inputs), saved with torch.jit.trace
and torch.jit.script (where torch can), run by `torchport run` on the saved archive, and
compared with PyTorch's outputs of the saved module (1e-4 * max(1, max|ref|), ints exactly).
Prints one row per model and way of saving: ok (max abs error), the error torchport gave
(file, line, construct), or torch's own failure. torchvision's detection models take a list
of images (an `.npz` for `torchport run`) and are scripted only; their boxes are compared
image by image with rows of tied scores in either order (`align`), and where they still
differ, against torch's float64 run of the same archive (`detector_verdict`).

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
from gen_torchscript import flat_outputs, prepare_detector  # noqa: E402
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


def hf_in(cls, cfgcls, inputs, **kw):
    """A transformers model whose inputs are not (ids, mask): `inputs()` makes them."""
    def make():
        import transformers as T
        return getattr(T, cls)(getattr(T, cfgcls)(torchscript=True, **kw)), inputs()
    return make


def ids():
    return (torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(0)),)


def pixels(s):
    return lambda: (torch.rand(2, 3, s, s, generator=torch.Generator().manual_seed(0)),)


def audio():
    return (torch.randn(2, 1600, generator=torch.Generator().manual_seed(0)),)


# Small transformers configurations: 2 layers of width 32, 2 heads.
LAYERS = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
TEXT = dict(vocab_size=100, max_position_embeddings=64, **LAYERS)
DECODER = dict(vocab_size=100, use_cache=False, **LAYERS)
CONV_AUDIO = dict(conv_dim=[16, 16], conv_stride=[5, 2], conv_kernel=[10, 3],
                  num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2, **LAYERS)
STAGES = dict(hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1])


def det(name, **kw):
    """A torchvision detection model (scripted only: it takes a list of images of any size,
    which `torchport run` gets as one `.npz`), with small images and the fixture generator's
    weights for detectors (`prepare_detector`: boxes and scores that spread, in a network
    whose float32 and float64 runs agree)."""
    def make():
        import torchvision
        m = torchvision.models.get_model(name, weights=None, weights_backbone=None,
                                         num_classes=5, **kw)
        g = torch.Generator().manual_seed(2)
        images = [torch.rand(3, 120, 160, generator=g), torch.rand(3, 100, 140, generator=g)]
        prepare_detector(m, images)
        return m, (images,)
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
    "tv_fasterrcnn_mobilenet_v3_large_320_fpn": det("fasterrcnn_mobilenet_v3_large_320_fpn"),
    "tv_fasterrcnn_resnet50_fpn": det("fasterrcnn_resnet50_fpn", min_size=128, max_size=160),
    "tv_retinanet_resnet50_fpn": det("retinanet_resnet50_fpn", min_size=128, max_size=160),
    "tv_fcos_resnet50_fpn": det("fcos_resnet50_fpn", min_size=128, max_size=160),
    "tv_ssdlite320_mobilenet_v3_large": det("ssdlite320_mobilenet_v3_large"),
    "tv_maskrcnn_resnet50_fpn": det("maskrcnn_resnet50_fpn", min_size=128, max_size=160),
    "tv_keypointrcnn_resnet50_fpn": det("keypointrcnn_resnet50_fpn", num_keypoints=5,
                                        min_size=128, max_size=160),
    "hf_distilbert": hf("DistilBertModel", "DistilBertConfig", vocab_size=100, dim=32,
                        n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=32),
    "hf_gpt2": hf("GPT2Model", "GPT2Config", vocab_size=100, n_embd=32, n_layer=2, n_head=2,
                  n_positions=32, use_cache=False),
    "tv_swin_v2_t": tv("swin_v2_t", num_classes=10),
    "tv_maxvit_t": tv("maxvit_t", s=224, num_classes=10),
    "tv_efficientnet_v2_s": tv("efficientnet_v2_s", num_classes=10),
    "timm_swin_tiny": timm_m("swin_tiny_patch4_window7_224", s=224, num_classes=10),
    "timm_edgenext_xx_small": timm_m("edgenext_xx_small", num_classes=10),
    "timm_xcit_nano_12_p16": timm_m("xcit_nano_12_p16_224", s=224, num_classes=10),
    "timm_convmixer_768_32": timm_m("convmixer_768_32", num_classes=10),
    "timm_coat_tiny": timm_m("coat_tiny", s=224, num_classes=10),
    "timm_levit_128s": timm_m("levit_128s", s=224, num_classes=10),
    "timm_tiny_vit_5m": timm_m("tiny_vit_5m_224", s=224, num_classes=10),
    "timm_efficientformer_l1": timm_m("efficientformer_l1", s=224, num_classes=10),
    "timm_sam2_hiera_tiny": timm_m("sam2_hiera_tiny", s=224, num_classes=10),
    "hf_bert": hf("BertModel", "BertConfig", **TEXT),
    "hf_roberta": hf("RobertaModel", "RobertaConfig", **TEXT),
    "hf_albert": hf("AlbertModel", "AlbertConfig", embedding_size=16, **TEXT),
    "hf_deberta_v2": hf("DebertaV2Model", "DebertaV2Config", **TEXT),
    "hf_mpnet": hf("MPNetModel", "MPNetConfig", **TEXT),
    "hf_mobilebert": hf("MobileBertModel", "MobileBertConfig", vocab_size=100,
                        max_position_embeddings=64, embedding_size=16, intra_bottleneck_size=16,
                        true_hidden_size=16, **LAYERS),
    "hf_t5_encoder": hf_in("T5EncoderModel", "T5Config", ids, vocab_size=100, d_model=32,
                           d_kv=16, d_ff=64, num_layers=2, num_heads=2),
    "hf_llama": hf_in("LlamaModel", "LlamaConfig", ids, num_key_value_heads=1, **DECODER),
    "hf_mistral": hf_in("MistralModel", "MistralConfig", ids, num_key_value_heads=1, **DECODER),
    "hf_qwen2": hf_in("Qwen2Model", "Qwen2Config", ids, num_key_value_heads=1, **DECODER),
    "hf_phi": hf_in("PhiModel", "PhiConfig", ids, **DECODER),
    "hf_gpt_neox": hf_in("GPTNeoXModel", "GPTNeoXConfig", ids, **DECODER),
    "hf_opt": hf_in("OPTModel", "OPTConfig", ids, vocab_size=100, hidden_size=32,
                    num_hidden_layers=2, num_attention_heads=2, ffn_dim=64,
                    word_embed_proj_dim=32, use_cache=False),
    "hf_vit": hf_in("ViTModel", "ViTConfig", pixels(32), image_size=32, patch_size=8, **LAYERS),
    "hf_clip_vision": hf_in("CLIPVisionModel", "CLIPVisionConfig", pixels(32), image_size=32,
                            patch_size=8, **LAYERS),
    "hf_dinov2": hf_in("Dinov2Model", "Dinov2Config", pixels(32), image_size=32, patch_size=8,
                       **LAYERS),
    "hf_convnext": hf_in("ConvNextModel", "ConvNextConfig", pixels(64), **STAGES),
    "hf_segformer": hf_in("SegformerModel", "SegformerConfig", pixels(64),
                          num_attention_heads=[1, 1, 2, 2], decoder_hidden_size=32, **STAGES),
    "hf_swin": hf_in("SwinModel", "SwinConfig", pixels(32), image_size=32, patch_size=4,
                     embed_dim=16, depths=[1, 1], num_heads=[1, 2], window_size=4),
    "hf_wav2vec2": hf_in("Wav2Vec2Model", "Wav2Vec2Config", audio, do_stable_layer_norm=True,
                         **CONV_AUDIO),
    "hf_hubert": hf_in("HubertModel", "HubertConfig", audio, **CONV_AUDIO),
}


def tolerance(ref):
    """How far a float output may be from torch's: 1e-4 * max(1, max|ref|); ints exactly."""
    ref = np.asarray(ref)
    if ref.dtype.kind != "f":
        return 0.0
    return 1e-4 * max(1.0, float(np.abs(ref).max()) if ref.size else 1.0)


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
            ok &= d <= tolerance(w)
        else:
            ok &= bool((g.astype(np.int64) == w.astype(np.int64)).all())
    return f"ok ({worst:.1e})" if ok else f"MISMATCH ({worst:.1e})"


def align(got, ref, dets, window=8):
    """A detector's flat outputs `got` (one group of arrays per image, in the order of its
    result's dicts) with each image's rows put in `ref`'s order where a row within `window`
    places agrees with `ref`'s row (floats within 1e-4 * max(1, max|ref|) of that output,
    ints exactly): boxes whose scores tie, or differ in the last bits, come in either order
    (torch's CPU sort is not stable), and a swap of two of them is not a difference."""
    out, at = [], 0
    for d in dets:
        k = len(d)
        g = [np.asarray(x) for x in got[at:at + k]]
        r = [np.asarray(x) for x in ref[at:at + k]]
        at += k
        n = len(r[0]) if k else 0
        if not k or any(len(x) != n for x in g + r):
            out += g
            continue
        tols = [tolerance(x) for x in r]

        def agree(i, j):
            return all(np.all(np.abs(a[i].astype(np.float64) - b[j].astype(np.float64)) <= t)
                       for a, b, t in zip(g, r, tols))

        order, used = [], set()
        for j in range(n):
            near = range(max(0, j - window), min(n, j + window + 1))
            found = [i for i in near if i not in used and agree(i, j)]
            i = found[0] if found else (j if j not in used else min(set(range(n)) - used))
            order.append(i)
            used.add(i)
        out += [x[order] for x in g]
    return out


def rows_agreeing(got, ref, dets):
    """How many leading rows of each image's outputs agree (floats within 1e-4 * max(1,
    max|ref|) of that output, ints exactly), summed over the images; and all rows."""
    agree = total = at = 0
    for d in dets:
        n = len(ref[at]) if len(d) else 0
        first = n
        for g, r in zip(got[at:at + len(d)], ref[at:at + len(d)]):
            r = np.asarray(r)
            if g.shape[1:] != r.shape[1:]:
                first = 0
                continue
            m = min(len(g), len(r))
            diff = np.abs(g[:m].astype(np.float64) - r[:m].astype(np.float64)).reshape(m, -1)
            tol = tolerance(r)
            bad = np.nonzero(diff.max(1) > tol)[0] if m else []
            first = min(first, int(bad[0]) if len(bad) else m)
        agree, total, at = agree + first, total + n, at + len(d)
    return agree, total


def detector_verdict(sm, inputs, got):
    """A detector's outputs against torch's, rows of tied scores in either order (`align`).
    Where they still differ, the ranking of boxes has met rounding: then against torch's
    float64 run of the same archive, ok where torchport's leading rows agree with it at least
    as far as torch's own float32 run's do."""
    with torch.no_grad():
        result = sm(*inputs)
        dets = result[1] if isinstance(result, tuple) else result
        ref = [t.numpy() for t in flat_outputs(result)]
        verdict = compare(align(got, ref, dets), [torch.from_numpy(r) for r in ref])
        if verdict.startswith("ok"):
            return verdict
        r64 = sm.double()(*[[t.double() for t in x] for x in inputs])
        d64 = r64[1] if isinstance(r64, tuple) else r64
        ref64 = [t.numpy() for t in flat_outputs(r64)]
    ours, total = rows_agreeing(align(got, ref64, d64), ref64, d64)
    theirs, _ = rows_agreeing(align(ref, ref64, d64), ref64, d64)
    how = f"{ours} of {total} rows as torch's float64 run; torch's float32 run {theirs}"
    return f"ok against float64 ({how})" if ours >= theirs else f"{verdict}; {how}"


def one(name, make, how, out, binary, runs):
    torch.manual_seed(0)
    try:
        m, inputs = make()
        if how == "trace" and isinstance(inputs[0], list):
            return "(takes a list: scripted only)"
        m.eval()
        with torch.no_grad():
            if not isinstance(inputs[0], list):
                randomize_norm_stats(m)
            sm = torch.jit.trace(m, inputs, strict=False) if how == "trace" else torch.jit.script(m)
            ref = flat_outputs(sm(*inputs))
    except Exception as e:  # noqa: BLE001 - torch's own failure is a result here
        return f"torch failed ({type(e).__name__}: {str(e).splitlines()[0][:80]})"
    p = out / f"{name}.{how}.pt"
    torch.jit.save(sm, p)
    args = [str(binary), "run", str(p)]
    for i, x in enumerate(inputs):
        if isinstance(x, list):
            # A list of tensors: one .npz, its arrays in order.
            np.savez(out / f"{name}.in{i}.npz", *[t.numpy() for t in x])
            args += ["--input", str(out / f"{name}.in{i}.npz")]
            continue
        np.save(out / f"{name}.in{i}.npy", x.numpy())
        args += ["--input", str(out / f"{name}.in{i}.npy")]
    args += ["--output", str(out / f"{name}.{how}.out.npz"), "--runs", str(runs)]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        return "error: " + r.stderr.strip().splitlines()[-1].replace(str(out) + "/", "")
    z = np.load(out / f"{name}.{how}.out.npz")
    got = [z[f"output_{i}"] for i in range(len(z.files))]
    if isinstance(inputs[0], list):
        verdict = detector_verdict(sm, inputs, got)
    else:
        verdict = compare(got, ref)
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
