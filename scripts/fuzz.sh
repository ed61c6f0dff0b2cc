#!/usr/bin/env bash
# Fuzzes each reader of outside bytes for longer than `make fuzz` does:
#   scripts/fuzz.sh [seconds per target, default 300] [target ...]   (default: all six)
# Builds the fuzz preset, then runs the targets one after another from their seeds
# (fuzz/corpus/NAME), the inputs they once failed on (fuzz/regressions/NAME) and what
# earlier runs found (build/fuzz/fuzz/corpus/NAME). An input that fails is written to
# build/fuzz/fuzz/artifacts/; fix the reader, add a test, and copy the input to
# fuzz/regressions/NAME/ so that every run replays it (docs/fuzzing.md).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-300}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(fuzz_idx fuzz_csv fuzz_records fuzz_safetensors fuzz_config fuzz_tf_config)

./scripts/install-deps.sh
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz
out=build/fuzz/fuzz
failed=()
for t in "${targets[@]}"; do
  inputs=("fuzz/corpus/$t")
  [ -d "fuzz/regressions/$t" ] && inputs+=("fuzz/regressions/$t")
  mkdir -p "$out/corpus/$t" "$out/artifacts"
  echo "== $t: ${seconds} s"
  if ! "$out/$t" -max_total_time="$seconds" -max_len=4096 -malloc_limit_mb=32 -rss_limit_mb=1024 -timeout=10 \
      -print_final_stats=1 -artifact_prefix="$out/artifacts/$t-" "$out/corpus/$t" "${inputs[@]}"; then
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: ${failed[*]} failed; the inputs are in $out/artifacts/" >&2
  exit 1
fi
echo "fuzz: ${#targets[@]} targets, ${seconds} s each, nothing found"
