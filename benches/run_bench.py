"""Benchmark `torchport run` (the runtime, release build) against PyTorch eager (and
onnxruntime when it is installed) on the same machine, same thread count, in one run; prints
every latency ratio.

    cargo build --release -p torchport-runtime --example run_timing
    /work/main/.venv/bin/python benches/run_bench.py [--threads 1,2] [--batch 1,8] [--runs 10]
        [--rounds 1 | --paired] [--models resnet18,bert_base] [--size 160,288] [--busy 1]
        [--binary PATH] [--json OUT.json]

Models are the libraries' own classes with random weights (no downloads): torchvision
ResNet-18/50, MobileNetV3-Large, EfficientNet-B0 (224x224); timm vit_small_patch16_224;
transformers BERT-base (input ids + attention mask), GPT-2 small and a Llama-style decoder of
~110 M parameters (input ids), all at sequence 128 (--size gives other image sides and sequence
lengths, to look for shapes the kernels handle worse). Each is exported once per batch size with
`torch.export.export` (the graph as given, no decompositions) under benches/out/
(gitignored). For every (model, batch, threads) the script times torch eager
(`torch.inference_mode`, `torch.set_num_threads`), onnxruntime (CPU EP,
`intra_op_num_threads`; only if `import onnxruntime` works; each model exported to ONNX once,
by the TorchScript-based exporter or, where it lacks an operator as for GPT-2 and the
Llama-style model, the torch.export-based one, which needs onnxscript) and torchport's run_timing
(`RAYON_NUM_THREADS`) back to back: medians of --runs after one warm-up run, and each one's
process CPU time per run (all threads; on a busy machine wall time mostly measures the other
processes, CPU time much less; at 2+ threads torch's OpenMP workers spin while waiting, which
counts as CPU time). With --rounds R each cell is measured R times, the engines
alternating, and each engine's least median (and least CPU time) is reported: on a machine
shared with other tenants, interference only adds time, so the least of several rounds is
the steadier estimate (one round's torch eager moved by ±30% here). With --paired the
engines instead take turns run by run (torch eager, torchport through `run_timing --serve`,
onnxruntime; 100 ms apart), --runs turns, and each ratio is the median of the per-turn ratios:
a slow spell of the machine that outlasts a turn then slows all three engines alike, where the
rounds above can catch one engine in a slow spell and the next in a fast one.
--export-only writes the missing exports and stops (run one such process per model to export
in parallel); --no-export then measures what is there and skips the rest.
--check CLI runs each export once with that torchport CLI build first and prints how far its
first output is from torch eager's.
--busy N keeps N other processes spinning while it measures (a machine the engines share).
--binary picks another run_timing build (e.g. a copy of the one before a change). --pin binds
torchport's pool threads one to a CPU (`pin_pool_threads`), which kept batch-1 CNNs on 2 threads
from losing their second core after the pauses of --paired (BENCHMARKS.md, 2026-12-04).
Load time against the time to read the archive, and peak memory against torch's, are
benches/load_bench.py's (same models and exports).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benches/out"
TIMING = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release/examples/run_timing"


# Each model is made by a function of (batch, size): size is the image's side for the vision
# models (224 unless --size says otherwise), the sequence's length for the text ones (128).
IMAGE, SEQ = 224, 128


def tv(name):
    def make(batch, size=IMAGE):
        import torchvision

        return torchvision.models.get_model(name, weights=None), (
            torch.randn(batch, 3, size, size),)

    return make


def vit_small(batch, size=IMAGE):
    import timm

    return timm.create_model("vit_small_patch16_224", pretrained=False, img_size=size), (
        torch.randn(batch, 3, size, size),)


def ids(batch, vocab, seq):
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))


def bert_base(batch, size=SEQ):
    import transformers as T

    m = T.BertModel(T.BertConfig())  # the defaults are BERT-base: 12 x 768, 30522 tokens
    x = ids(batch, 30522, size)
    return m, (x, torch.ones_like(x))


def gpt2_small(batch, size=SEQ):
    import transformers as T

    m = T.GPT2Model(T.GPT2Config(use_cache=False))  # defaults: GPT-2 small, 12 x 768
    return m, (ids(batch, 50257, size),)


def llama_100m(batch, size=SEQ):
    import transformers as T

    cfg = T.LlamaConfig(vocab_size=32000, hidden_size=768, intermediate_size=2048,
                        num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4,
                        max_position_embeddings=max(512, size), use_cache=False)
    return T.LlamaModel(cfg), (ids(batch, 32000, size),)


# transformers models take their inputs by keyword for the ONNX export: the TorchScript-based
# exporter passes them positionally, where transformers 5's forward has other parameters.
KEYWORDS = {"bert_base": ("input_ids", "attention_mask"), "gpt2_small": ("input_ids",),
            "llama_100m": ("input_ids",)}


class ByKeyword(torch.nn.Module):
    """`model(**{name: x})` with the outputs as a tuple, for the ONNX export."""

    def __init__(self, model, names):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *xs):
        return self.model(**dict(zip(self.names, xs)), return_dict=False)


MODELS = {
    "resnet18": tv("resnet18"),
    "resnet50": tv("resnet50"),
    "mobilenet_v3_large": tv("mobilenet_v3_large"),
    "efficientnet_b0": tv("efficientnet_b0"),
    "vit_small": vit_small,
    "bert_base": bert_base,
    "gpt2_small": gpt2_small,
    "llama_100m": llama_100m,
}


def time_it(fn, runs):
    """(median wall ms, process CPU ms per run) over `runs` calls after one warm-up."""
    fn()
    ts = []
    c0 = time.process_time()
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts), (time.process_time() - c0) * 1e3 / runs


def stem(name, batch, size=None):
    """The exports' path without suffix: `NAME_bBATCH`, with `_sSIZE` for a size other than
    the model's own default."""
    return OUT / (f"{name}_b{batch}" + (f"_s{size}" if size else ""))


def build(name, batch, size=None):
    """(model in eval mode, inputs, input .npy paths, written): the model as the library
    builds it, its inputs seeded; `size` None (the default) for the model's own input size."""
    torch.manual_seed(0)
    model, inputs = MODELS[name](batch, size) if size else MODELS[name](batch)
    model.eval()
    npys = [Path(f"{stem(name, batch, size)}.input_{i}.npy") for i in range(len(inputs))]
    for p, x in zip(npys, inputs):
        np.save(p, x.numpy())
    return model, inputs, npys


def export(name, batch, size=None):
    """(model, inputs, .pt2 path, input .npy paths), exporting on first use (see `build`)."""
    model, inputs, npys = build(name, batch, size)
    pt2 = Path(f"{stem(name, batch, size)}.pt2")
    if not pt2.exists():
        with torch.no_grad():
            ep = torch.export.export(model, inputs)
        torch.export.save(ep, pt2)
    return model, inputs, pt2, npys


def check(cli, model, inputs, pt2, npys, runs=1):
    """How far torchport's first output (`cli run` on the export, its last of `runs`) is from
    torch eager's, as a line to print: a speed is worth only what the outputs are."""
    out = pt2.with_suffix(".check.npz")
    cmd = [str(cli), "run", str(pt2), *(a for p in npys for a in ("--input", str(p))),
           "--output", str(out), "--runs", str(runs)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return "torchport run failed: " + (p.stderr.strip().splitlines() or ["?"])[-1]
    with torch.inference_mode():
        ref = model(*inputs)
    ref = (ref if isinstance(ref, torch.Tensor) else ref[0]).numpy().astype(np.float64)
    with np.load(out) as z:
        got = z["output_0"].astype(np.float64)
    out.unlink()
    if got.shape != ref.shape:
        return f"output 0 has shape {got.shape}, torch's {ref.shape}"
    return (f"max abs error {np.max(np.abs(got - ref)):.1e} "
            f"(largest |value| {np.max(np.abs(ref)):.1e})")


def run_timing_env(args, th):
    """run_timing's environment: `th` pool threads, bound one to a CPU with --pin, and this
    process's own TORCHPORT_* settings (e.g. TORCHPORT_WAIT_POLICY)."""
    env = {k: v for k, v in os.environ.items() if k.startswith("TORCHPORT_")}
    env.update({"RAYON_NUM_THREADS": str(th), "PATH": "/usr/bin:/bin"})
    if args.pin:
        env["TORCHPORT_PIN_THREADS"] = "1"
    return env


def least(a, b):
    """The smaller of two measurements, either of which may be missing (None)."""
    return b if a is None else a if b is None else min(a, b)


def export_onnx(name, m, inputs, onnx_path):
    """Write `m`'s ONNX export to `onnx_path`: by the TorchScript-based exporter (opset 17),
    else, where that lacks an operator (GPT-2's and the Llama-style model's `aten::diff`), by
    the `torch.export`-based one (needs onnxscript); neither: no onnxruntime column."""
    try:
        torch.onnx.export(m, inputs, onnx_path, dynamo=False, opset_version=17)
        return
    except Exception as e:
        first = f"{type(e).__name__}: {str(e)[:120]}"
        onnx_path.unlink(missing_ok=True)
    try:
        torch.onnx.export(m, inputs, onnx_path, dynamo=True)
        print(f"{name}: ONNX by the torch.export-based exporter ({first})", flush=True)
    except Exception as e:
        print(f"{name}: no ONNX export ({first}; torch.export-based: {type(e).__name__}: "
              f"{str(e)[:120]})", flush=True)
        onnx_path.unlink(missing_ok=True)


def ort_session(ort, onnx_path, inputs, th):
    """(onnxruntime session on `th` threads, its input feed), or (None, None) without
    onnxruntime or an ONNX export."""
    if not (ort and onnx_path.exists()):
        return None, None
    so = ort.SessionOptions()
    so.intra_op_num_threads = th
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
    return sess, {i.name: x.numpy() for i, x in zip(sess.get_inputs(), inputs)}


# Between two engines' runs: the threads of the one that just ran (OpenMP's, onnxruntime's)
# spin a while before they sleep, and must not take the next one's cores (with 10 ms between
# the turns of --paired here, torch eager's MobileNetV3 at batch 1 on 2 threads took 81 ms a
# run instead of 28; with 100 or 300 ms, 28).
PAUSE_S = 0.1


def measure(args, model, inputs, pt2, npys, onnx_path, ort, th):
    """One round at `th` threads: (eager median ms, eager CPU ms per run, onnxruntime median
    ms or None, run_timing's JSON), each engine timed after the other, `PAUSE_S` apart (on the
    16-core machine of BENCHMARKS.md, 2026-12-04, torchport timed straight after onnxruntime
    on 16 threads came out slower than in a process of its own later, ViT-S at batch 1 50.7
    against 32.2 ms; why was not established)."""
    torch.set_num_threads(th)
    with torch.inference_mode():
        eager, eager_cpu = time_it(lambda: model(*inputs), args.runs)
    time.sleep(PAUSE_S)
    onnx_ms = None
    sess, feed = ort_session(ort, onnx_path, inputs, th)
    if sess:
        onnx_ms = time_it(lambda: sess.run(None, feed), args.runs)[0]
        del sess
        time.sleep(PAUSE_S)
    env = run_timing_env(args, th)
    res = subprocess.run(
        [str(args.binary), str(pt2), *map(str, npys), "--runs", str(args.runs)],
        capture_output=True, text=True, env=env, check=True)
    return eager, eager_cpu, onnx_ms, json.loads(res.stdout.strip().splitlines()[-1])


def measure_paired(args, model, inputs, pt2, npys, onnx_path, ort, th):
    """--paired: torch eager, torchport (run_timing --serve) and onnxruntime each run once in
    turn, --runs times, so that all three meet the same spells of a shared machine's
    slowness. Returns (eager median ms, eager CPU ms per run, onnxruntime median ms or None,
    run_timing's JSON over its runs, median of the per-turn torchport / eager ratios, median
    of the per-turn torchport / onnxruntime ratios or None)."""
    torch.set_num_threads(th)
    sess, feed = ort_session(ort, onnx_path, inputs, th)
    env = run_timing_env(args, th)
    proc = subprocess.Popen([str(args.binary), str(pt2), *map(str, npys), "--serve"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    if proc.stdout.readline().strip() != "ready":
        sys.exit(f"{args.binary} --serve did not start on {pt2}")
    eager, tp, onnx, eager_cpu = [], [], [], 0.0
    with torch.inference_mode():
        model(*inputs)  # warm-up (run_timing warms up before `ready`)
        if sess:
            sess.run(None, feed)
        for _ in range(args.runs):
            c, t = time.process_time(), time.perf_counter()
            model(*inputs)
            eager.append((time.perf_counter() - t) * 1e3)
            eager_cpu += time.process_time() - c
            time.sleep(PAUSE_S)
            proc.stdin.write("run\n")
            proc.stdin.flush()
            tp.append(float(proc.stdout.readline()))
            time.sleep(PAUSE_S)
            if sess:
                t = time.perf_counter()
                sess.run(None, feed)
                onnx.append((time.perf_counter() - t) * 1e3)
                time.sleep(PAUSE_S)
    proc.stdin.close()
    js = json.loads(proc.stdout.read().strip().splitlines()[-1])
    proc.wait()
    med = statistics.median
    return (med(eager), eager_cpu * 1e3 / args.runs, med(onnx) if onnx else None, js,
            med(a / b for a, b in zip(tp, eager)),
            med(a / b for a, b in zip(tp, onnx)) if onnx else None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--batch", default="1,8", help="comma-separated batch sizes")
    ap.add_argument("--size", default="",
                    help="comma-separated sizes: the image's side for the vision models "
                         f"(default {IMAGE}), the sequence's length for the text ones "
                         f"(default {SEQ}); exports of a size not the default are named "
                         "NAME_bBATCH_sSIZE")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated, of: " + ", ".join(MODELS))
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure each (model, batch, threads) this many times, the engines "
                         "alternating, and report each engine's least median (other tenants "
                         "of a shared machine only add time)")
    ap.add_argument("--paired", action="store_true",
                    help="run the engines in turn, one run each, --runs times (instead of "
                         "--runs of one engine, then the next); ratios are the medians of the "
                         "per-turn ratios")
    ap.add_argument("--binary", type=Path, default=TIMING,
                    help="run_timing executable (default: the release build of this checkout)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument("--export-only", action="store_true",
                    help="write the exports (.pt2, inputs, .onnx) that are missing, then stop: "
                         "several models can be exported in parallel processes this way")
    ap.add_argument("--no-export", action="store_true",
                    help="measure only what is exported already: a (model, batch) without its "
                         ".pt2 is skipped, and onnxruntime without its .onnx")
    ap.add_argument("--check", type=Path, metavar="CLI",
                    help="before timing, run each export once with this torchport CLI build "
                         "(`CLI run`) and print how far its first output is from torch eager's")
    ap.add_argument("--busy", type=int, default=0, metavar="N",
                    help="keep N other processes busy (each spinning on a CPU) while measuring: "
                         "how each engine copes with a machine it does not have to itself")
    ap.add_argument("--pin", action="store_true",
                    help="torchport's pool threads bound one to a CPU (TORCHPORT_PIN_THREADS; "
                         "torch's and onnxruntime's threads are left as they are)")
    args = ap.parse_args()
    if args.paired and args.rounds > 1:
        ap.error("--paired takes no --rounds: give more --runs")
    if args.export_only and args.no_export:
        ap.error("--export-only and --no-export exclude each other")
    if not (args.export_only or args.binary.exists()):
        sys.exit("build first: cargo build --release -p torchport-runtime --example run_timing")
    try:
        import onnxruntime as ort
    except ImportError:
        ort = None
    threads = [int(t) for t in args.threads.split(",")]
    batches = [int(b) for b in args.batch.split(",")]
    sizes = [int(s) for s in args.size.split(",")] if args.size else [None]
    OUT.mkdir(parents=True, exist_ok=True)
    print(f"load average at start: {os.getloadavg()[0]:.2f}; onnxruntime: "
          f"{ort.__version__ if ort else 'not installed'}"
          f"{'; torchport threads bound to CPUs' if args.pin else ''}", flush=True)
    rows = []
    # --busy: other processes, each spinning on a CPU, for the whole measurement.
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(args.busy if not args.export_only else 0)]
    try:
        measure_all(args, ort, threads, batches, sizes, rows)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    if args.export_only:
        return
    how = ("paired: the engines in turn, one run each; ratios are medians of the per-turn "
           "ratios" if args.paired else
           f"rounds={args.rounds} (least median of the rounds, ms)")
    how += f"; {args.busy} other processes busy" if args.busy else ""
    print(f"\nruns={args.runs}, {how}; load average at end: {os.getloadavg()[0]:.2f}")
    print("| model | batch | threads | torch eager | torchport | torchport / eager |"
          + (" onnxruntime | torchport / ort |" if ort else "")
          + " torchport load | CPU per run: torch / torchport | CPU ratio |")
    print("|---|---:|---:|---:|---:|---:|" + ("---:|---:|" if ort else "") + "---:|---:|---:|")
    for r in rows:
        o = ((f" {r['ort_ms']:.1f} | {r['by_ort']:.2f} |" if r["ort_ms"]
              else " — | — |") if ort else "")
        tc, ec = r["torchport_cpu_ms"], r["eager_cpu_ms"]
        print(f"| {r['model']} | {r['batch']} | {r['threads']} | {r['eager_ms']:.1f} | "
              f"{r['torchport_ms']:.1f} | {r['by_eager']:.2f} |{o} "
              f"{r['load_ms']:.0f} | {ec:.0f} / {tc:.0f} | {tc / ec:.2f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


def measure_all(args, ort, threads, batches, sizes, rows):
    """Export what is missing and measure every (model, batch, size, threads) cell into
    `rows` (printing each as it is measured)."""
    cells = [(n, b, s) for n in args.models.split(",") for b in batches for s in sizes]
    for name, batch, size in cells:
        label = f"{name}_s{size}" if size else name
        if args.no_export and not Path(f"{stem(name, batch, size)}.pt2").exists():
            print(f"{label} b{batch}: not exported, skipped", flush=True)
            continue
        model, inputs, pt2, npys = export(name, batch, size)
        onnx_path = pt2.with_suffix(".onnx")
        if ort and not onnx_path.exists() and not args.no_export:
            m = ByKeyword(model, KEYWORDS[name]) if name in KEYWORDS else model
            export_onnx(name, m, inputs, onnx_path)
        if args.export_only:
            continue
        if args.check:
            torch.set_num_threads(max(threads))
            print(f"{label} b{batch}: {check(args.check, model, inputs, pt2, npys)}",
                  flush=True)
        for th in threads:
            if args.paired:
                eager, eager_cpu, onnx_ms, tp, by_eager, by_ort = measure_paired(
                    args, model, inputs, pt2, npys, onnx_path, ort, th)
                tp_cpu = tp.get("cpu_ms")
            else:
                eager = eager_cpu = onnx_ms = tp = tp_cpu = None
                for _ in range(max(1, args.rounds)):
                    e, ec, o, t = measure(args, model, inputs, pt2, npys, onnx_path, ort, th)
                    eager, eager_cpu = least(eager, e), least(eager_cpu, ec)
                    onnx_ms, tp_cpu = least(onnx_ms, o), least(tp_cpu, t.get("cpu_ms"))
                    if tp is None or t["median_ms"] < tp["median_ms"]:
                        tp = t
                by_eager = tp["median_ms"] / eager
                by_ort = tp["median_ms"] / onnx_ms if onnx_ms else None
            row = dict(model=label, batch=batch, threads=th, torchport_ms=tp["median_ms"],
                       eager_ms=eager, ort_ms=onnx_ms, load_ms=tp["load_ms"],
                       torchport_cpu_ms=tp_cpu, eager_cpu_ms=eager_cpu,
                       by_eager=by_eager, by_ort=by_ort)
            rows.append(row)
            ort_s = f"{onnx_ms:8.1f} {by_ort:6.2f}" if onnx_ms else ""
            print(f"{label:<19} b{batch:<2} t{th}  torchport {tp['median_ms']:8.1f}  "
                  f"eager {eager:8.1f}  tp/eager {by_eager:5.2f}  "
                  f"load {tp['load_ms']:6.0f}  cpu {float('nan') if tp_cpu is None else tp_cpu:7.1f} / "
                  f"{eager_cpu:7.1f} {ort_s}", flush=True)


if __name__ == "__main__":
    main()
