#!/usr/bin/env bash
# Thread scaling of torchport against PyTorch eager and onnxruntime on a many-core machine
# (issue 14), as one unattended script: the machine's CPUs and torch's threading first, then
# every model exported in parallel processes (one per model), then benches/run_bench.py one
# model at a time, so that a model that fails leaves the others' rows.
#
#   cargo build --release -p torchport-runtime --example run_timing && cargo build --release -p torchport-cli
#   benches/scaling.sh [THREADS (1,4,16)] [RUNS (5)]
#
# On a 16-core Xeon all eight models at 1, 2 and 16 threads, batch 1 and 8, 5 runs, back to
# back (--rounds 1, no profiles), took 548 s, exports (62 s) included. With the turns of
# --paired (3 pauses of 0.1 s a turn) and the profiles on top, that is more than one 10-minute
# call: split MODELS over two calls, or measure THREADS=1,16.
#
# Environment: PYTHON (python3) with torch, torchvision, timm, transformers, onnxruntime and
# onnxscript; BINARY (target/release/examples/run_timing); CLI (target/release/torchport, whose
# `run` checks each export's output against torch eager's first); MODELS (all eight, space-separated,
# in the order measured); BATCH (1,8); EXPORT_S (240, the limit on each model's exports);
# MODE (--paired: the engines in turns, run by run, each ratio the median of the per-turn
# ratios; on the 16-core machine of BENCHMARKS.md, 2026-12-04, one engine's one-thread times
# moved by up to 1.5x between runs one after another; "--rounds 1" for back-to-back runs);
# PROFILE (1: after the timings, each export's operators and its 12 slowest nodes at the
# fewest and the most threads, each node's least of 3 runs, TORCHPORT_PROFILE of run_timing,
# then run_timing's JSON line: load, warm read and read into new memory, peak RSS; and the
# median at the most threads with the pool's threads waiting actively and passively,
# TORCHPORT_WAIT_POLICY; 0: not); BASELINE (a second run_timing build, say the one before a
# change, carried along stripped: then, after the exports, the two builds' medians of 10 runs
# taken in turns, three rounds, per model, batch and thread count, before anything else).
set -u
cd "$(dirname "$0")/.."
THREADS=${1:-1,4,16}
RUNS=${2:-5}
PY=${PYTHON:-python3}
BIN=${BINARY:-target/release/examples/run_timing}
CLI=${CLI:-target/release/torchport}
BATCH=${BATCH:-1,8}
MODE=${MODE:---paired}
MODELS=${MODELS:-resnet18 vit_small bert_base resnet50 mobilenet_v3_large efficientnet_b0 gpt2_small llama_100m}
export PYTHONUNBUFFERED=1

date -u
echo "CPUs: $(nproc)"
lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core|Socket|NUMA node\(s\)|L2|L3)' || true
grep -o -w -E 'avx512f|avx512_bf16|amx_tile|avx2' /proc/cpuinfo | sort | uniq -c || true
$PY -c 'import torch; print("torch", torch.__version__); print(torch.__config__.parallel_info())'

t0=$(date +%s)
for m in $MODELS; do
  OMP_NUM_THREADS=2 timeout "${EXPORT_S:-240}" "$PY" benches/run_bench.py --export-only \
    --models "$m" --batch "$BATCH" >"/tmp/scaling_export_$m.log" 2>&1 &
done
wait
echo "exports: $(($(date +%s) - t0)) s"
for m in $MODELS; do grep -v '^load average' "/tmp/scaling_export_$m.log" | tail -n 3; done

if [ -n "${BASELINE:-}" ]; then
  for round in 1 2 3; do
    for m in $MODELS; do
      for b in ${BATCH//,/ }; do
        stem=benches/out/${m}_b$b
        [ -f "$stem.pt2" ] || continue
        for t in ${THREADS//,/ }; do
          for bin in "$BASELINE" "$BIN"; do
            echo "ab $round ${m}_b$b t$t $bin $(RAYON_NUM_THREADS=$t "$bin" "$stem.pt2" \
              "$stem".input_*.npy --runs 10 2>&1 | grep -o '"median_ms": [0-9.]*')"
          done
        done
      done
    done
  done
fi
for m in $MODELS; do
  "$PY" benches/run_bench.py --no-export --models "$m" --batch "$BATCH" --threads "$THREADS" \
    --runs "$RUNS" --binary "$BIN" --check "$CLI" $MODE || echo "$m: run_bench failed"
done
if [ "${PROFILE:-1}" = 1 ]; then
  for m in $MODELS; do
    for b in ${BATCH//,/ }; do
      stem=benches/out/${m}_b$b
      [ -f "$stem.pt2" ] || continue
      for t in "${THREADS%%,*}" "${THREADS##*,}"; do
        echo "== profile $m batch $b, $t threads"
        TORCHPORT_PROFILE=3 TORCHPORT_PROFILE_NODES=12 RAYON_NUM_THREADS=$t \
          "$BIN" "$stem.pt2" "$stem".input_*.npy --runs 1 2>&1
      done
      # The pool's threads between loops at the most threads: looking for work (torchport's
      # default) or asleep (TORCHPORT_WAIT_POLICY=passive), alternated twice.
      for policy in active passive active passive; do
        echo "== $m batch $b, ${THREADS##*,} threads, wait policy $policy: $(
          TORCHPORT_WAIT_POLICY=$policy RAYON_NUM_THREADS=${THREADS##*,} "$BIN" "$stem.pt2" \
            "$stem".input_*.npy --runs 5 2>&1 | grep -o '"median_ms": [0-9.]*')"
      done
    done
  done
fi
date -u
