#!/usr/bin/env bash
# Seed and fuzz every target for a set time each, then print a summary table.
#
#   fuzz/run_all.sh [SECONDS_PER_TARGET]        (default 600)
#
# Environment (all optional):
#   FUZZ_TARGETS="pickle torch_zip"  only these targets (default: every [[bin]] in Cargo.toml)
#   FUZZ_PARALLEL=1                  targets fuzzed at once (each is one libFuzzer job)
#   FUZZ_SANITIZER=address           address | none (none when the ASan runtime is missing)
#   FUZZ_MAX_LEN=65536               largest input libFuzzer generates, bytes (raised to the
#                                    target's largest seed)
#   FUZZ_RSS_MB=2048                 libFuzzer's memory limit (an input above it is an OOM)
#   FUZZ_MALLOC_MB=1024              largest single allocation allowed (above it is an OOM)
#   FUZZ_TIMEOUT=10                  seconds one input may take (above it is a timeout)
#   FUZZ_FORK=0                      1: keep fuzzing after a crash (libFuzzer fork mode)
#
# Needs cargo-fuzz (`cargo install cargo-fuzz`). libFuzzer needs nightly rustc flags; on a
# stable toolchain the script sets RUSTC_BOOTSTRAP=1, which lets stable rustc accept them.
# Crashing inputs land in fuzz/artifacts/<target>/, logs in fuzz/artifacts/logs/<target>.log.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

secs="${1:-600}"
parallel="${FUZZ_PARALLEL:-1}"
san="${FUZZ_SANITIZER:-address}"
max_len="${FUZZ_MAX_LEN:-65536}"
rss="${FUZZ_RSS_MB:-2048}"
malloc_mb="${FUZZ_MALLOC_MB:-1024}"
timeout="${FUZZ_TIMEOUT:-10}"
fork="${FUZZ_FORK:-0}"

if ! rustc --version | grep -q nightly; then
    export RUSTC_BOOTSTRAP=1
fi

if [ -n "${FUZZ_TARGETS:-}" ]; then
    read -r -a targets <<<"$FUZZ_TARGETS"
else
    mapfile -t targets < <(awk '/^\[\[bin\]\]/{b=1} b&&/^name =/{gsub(/"/,"",$3); print $3; b=0}' Cargo.toml)
fi

./seed.sh "${targets[@]}" || exit 2
echo "building ${#targets[@]} targets (sanitizer: $san)…"
mkdir -p artifacts/logs
for t in "${targets[@]}"; do
    cargo fuzz build -s "$san" "$t" >/dev/null 2>artifacts/logs/build.log || {
        echo "build of $t failed:"; tail -20 artifacts/logs/build.log; exit 2; }
done
bin_dir="target/$(rustc -vV | sed -n 's/^host: //p')/release"

extra=()
[ "$fork" = 1 ] && extra=(-fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)

run_one() {
    local t="$1" log="artifacts/logs/$1.log" start end
    mkdir -p "artifacts/$t"
    # Never shorter than the largest seed: a truncated zip seed loses its directory.
    local len largest
    largest=$(find "corpus/$t" -type f -printf '%s\n' | sort -n | tail -1)
    len=$(( ${largest:-0} > max_len ? ${largest:-0} : max_len ))
    start=$(date +%s)
    touch "artifacts/$t/.run-start"
    # The binary built above, run directly (as `cargo fuzz run` would): editing the
    # library while the fuzzers run does not rebuild, or break, the targets still to come.
    ASAN_OPTIONS="detect_odr_violation=0" "$bin_dir/$t" -artifact_prefix="artifacts/$t/" \
        -max_total_time="$secs" -max_len="$len" -rss_limit_mb="$rss" \
        -malloc_limit_mb="$malloc_mb" -timeout="$timeout" -print_final_stats=1 \
        "${extra[@]}" "corpus/$t" >"$log" 2>&1
    local rc=$?
    end=$(date +%s)
    echo "$rc $((end - start))" >"artifacts/logs/$t.result"
}

running=0
for t in "${targets[@]}"; do
    echo "fuzzing $t for ${secs}s…"
    run_one "$t" &
    running=$((running + 1))
    if [ "$running" -ge "$parallel" ]; then
        wait -n
        running=$((running - 1))
    fi
done
wait

printf '\n%-14s %8s %12s %9s %8s  %s\n' target seconds executions exec/s crashes result
status=0
for t in "${targets[@]}"; do
    log="artifacts/logs/$t.log"
    read -r rc took <"artifacts/logs/$t.result"
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    [ -n "$execs" ] || execs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
    [ -n "$execs" ] || execs=0
    found=$(find "artifacts/$t" -maxdepth 1 -type f -newer "artifacts/$t/.run-start" \
        \( -name 'crash-*' -o -name 'timeout-*' -o -name 'oom-*' -o -name 'leak-*' \) | wc -l)
    result=ok
    if [ "$rc" != 0 ] || [ "$found" != 0 ]; then
        result="FAILED (exit $rc): $(grep -m1 -oE 'ERROR: libFuzzer: [a-z-]+|panicked at [^:]+:[0-9]+|ERROR: AddressSanitizer: [a-z-]+' "$log" || echo "see $log")"
        status=1
    fi
    printf '%-14s %8s %12s %9s %8s  %s\n' "$t" "$took" "$execs" "$((execs / (took > 0 ? took : 1)))" "$found" "$result"
done
exit $status
