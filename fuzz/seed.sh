#!/usr/bin/env bash
# Seed fuzz/corpus/<target>/ from the committed fixtures (idempotent; corpora are gitignored).
#   a format target   : the fixtures of that format under tests/fixtures/ (hostile ones too):
#                       safetensors, npy, npz, onnx, pt2 by extension; torchscript: the
#                       scripted/traced archives and hostile ts_* files; sharded: *.index.json
#   rules             : every *.toml fixture and every ```toml block of docs/RULES.md
#   pt2_program       : the models/*.json record of every .pt2 fixture
#   ts_code           : every code/**.py record of the .pt fixtures (TorchScript code)
#   pickle            : crates/torchport-pickle/tests/corpus/*, every *.pkl record of the zip
#                       fixtures, and the legacy fixtures (a stream of pickles)
#   any other target  : every fixture under tests/fixtures/ (any format)
# Usage: fuzz/seed.sh [TARGET...]   (default: every target in fuzz/Cargo.toml)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
cd "$here"

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(awk '/^\[\[bin\]\]/{b=1} b&&/^name =/{gsub(/"/,"",$3); print $3; b=0}' Cargo.toml)
fi

# Fixture files: everything under tests/fixtures except generators, expected outputs and the
# stems/ sweep (192 archives that differ only in their names).
fixtures() {
    find "$root/tests/fixtures" -type f \
        ! -path '*/gen/*' ! -path '*/stems/*' ! -name '*.expected.*' ! -name '*.json' ! -name '*.py' ! -name '*.md' \
        | sort
}

seed_name() { # a readable, unique corpus file name for a source path
    local rel="${1#"$root"/}"
    echo "${rel//\//_}"
}

for t in "${targets[@]}"; do
    dir="corpus/$t"
    mkdir -p "$dir"
    n=0
    if [ "$t" = pickle ]; then
        for f in "$root"/crates/torchport-pickle/tests/corpus/*; do
            [ -f "$f" ] && cp "$f" "$dir/$(seed_name "$f")" && n=$((n + 1))
        done
        while IFS= read -r f; do
            # zip fixtures: extract each *.pkl record; legacy streams: the file itself.
            if head -c 4 "$f" | grep -q $'^PK\x03\x04' 2>/dev/null; then
                while IFS= read -r rec; do
                    [ -n "$rec" ] || continue
                    unzip -p "$f" "$rec" > "$dir/$(seed_name "$f")_${rec//\//_}" 2>/dev/null \
                        && n=$((n + 1))
                done < <(unzip -Z1 "$f" 2>/dev/null | grep '\.pkl$' || true)
            elif [ "$(head -c 2 "$f" | od -An -tx1 | tr -d ' ')" = 8002 ]; then
                cp "$f" "$dir/$(seed_name "$f")" && n=$((n + 1))
            fi
        done < <(fixtures)
    elif [ "$t" = pt2_program ]; then
        while IFS= read -r f; do
            while IFS= read -r rec; do
                [ -n "$rec" ] || continue
                unzip -p "$f" "$rec" > "$dir/$(seed_name "$f")_${rec//\//_}" 2>/dev/null \
                    && n=$((n + 1))
            done < <(unzip -Z1 "$f" 2>/dev/null | grep -E '(^|/)models/[^/]*\.json$|^serialized_exported_program\.json$' || true)
        done < <(find "$root/tests/fixtures" -name '*.pt2' ! -path '*/stems/*' | sort)
    elif [ "$t" = ts_code ]; then
        # Every code record of the TorchScript fixtures (traced, scripted, hostile).
        while IFS= read -r f; do
            while IFS= read -r rec; do
                [ -n "$rec" ] || continue
                unzip -p "$f" "$rec" > "$dir/$(seed_name "$f")_${rec//\//_}" 2>/dev/null \
                    && n=$((n + 1))
            done < <(unzip -Z1 "$f" 2>/dev/null | grep -E '/code/.*\.py$' || true)
        done < <(find "$root/tests/fixtures" -name '*.pt' ! -path '*/stems/*' | sort)
    elif [ "$t" = rules ]; then
        while IFS= read -r f; do
            cp "$f" "$dir/$(seed_name "$f")" && n=$((n + 1))
        done < <(find "$root/tests/fixtures" -name '*.toml' | sort)
        # Each ```toml block of the rules guide is a seed of its own.
        awk -v out="$dir/docs_RULES.md_" '
            /^```toml/ { inblock = 1; k++; next }
            /^```/     { inblock = 0; next }
            inblock    { print > (out k ".toml") }' "$root/docs/RULES.md"
        n=$((n + $(grep -c '^```toml' "$root/docs/RULES.md")))
    else
        case "$t" in
            safetensors | npy | npz | onnx | pt2) pick() { [[ "$1" == *".$t" ]]; } ;;
            torchscript) pick() { [[ "$1" =~ /(scripted_|traced_|ts_)[^/]*\.pt$ ]]; } ;;
            sharded) pick() { [[ "$1" == *.index.json ]]; } ;;
            *) pick() { true; } ;;
        esac
        while IFS= read -r f; do
            if pick "$f"; then cp "$f" "$dir/$(seed_name "$f")" && n=$((n + 1)); fi
        done < <(fixtures; find "$root/tests/fixtures" -name '*.index.json' | sort)
    fi
    echo "seeded $dir with $n files ($(ls "$dir" | wc -l) in the corpus)"
done
