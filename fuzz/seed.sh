#!/usr/bin/env bash
# Seed fuzz/corpus/<target>/ from the committed fixtures (idempotent; corpora are gitignored).
#   every file target : every fixture under tests/fixtures/ (any format, hostile ones too)
#   pickle            : crates/torchport-pickle/tests/corpus/*, every *.pkl record of the zip
#                       fixtures, and the legacy fixtures (a stream of pickles)
# Usage: fuzz/seed.sh [TARGET...]   (default: every target in fuzz/Cargo.toml)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
cd "$here"

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(awk '/^\[\[bin\]\]/{b=1} b&&/^name =/{gsub(/"/,"",$3); print $3; b=0}' Cargo.toml)
fi

# Fixture files: everything under tests/fixtures except generators and expected outputs.
fixtures() {
    find "$root/tests/fixtures" -type f \
        ! -path '*/gen/*' ! -name '*.expected.*' ! -name '*.json' ! -name '*.py' ! -name '*.md' \
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
    else
        while IFS= read -r f; do
            cp "$f" "$dir/$(seed_name "$f")" && n=$((n + 1))
        done < <(fixtures)
    fi
    echo "seeded $dir with $n files ($(ls "$dir" | wc -l) in the corpus)"
done
