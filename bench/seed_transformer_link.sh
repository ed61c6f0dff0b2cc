#!/usr/bin/env bash
# The first seed's worst case: a transformer whose gradients are tens of MB, trained by two
# workers over a link, spends most of its step communicating at small batches. Two
# network namespaces joined by a veth pair that tbf limits to RATE stand for two hosts;
# each worker computes on one thread (one core each on a 2-core machine). For each
# per-replica batch (the global batch is twice it) it runs the pair, then `dtrain doctor
# --runs` on one worker's summary and a one-worker run's, and prints the communication
# share of the step, samples/s against one worker, and the doctor's first finding; then the
# doctor's fixes for the smallest batch (bf16 compression, accumulating 4 batches), measured.
#
#   sudo bench/seed_transformer_link.sh [RATE] [BATCHES] [STEPS]   (1gbit, "2 8 32", 12)
#
# The model: examples/configs/seed_transformer.json (4 blocks 512 wide, 8 heads, 12.9 M
# weights, 51.6 MB of float32 gradients a step), on the dictionary's text (dict-gcide,
# scripts/install-deps.sh --corpora).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dtrain=${DTRAIN:-$here/build/release/dtrain}
rate=${1:-1gbit}
batches=${2:-2 8 32}
steps=${3:-12}
. "$here/scripts/netns_pair.sh"
netns_bench_ready seed_transformer_link.sh "$dtrain"
[ -f /usr/share/dictd/gcide.dict.dz ] ||
  { echo "seed_transformer_link.sh: install dict-gcide (scripts/install-deps.sh --corpora)" >&2; exit 1; }

tag=$$
netns_pair_session dtrain_seedtf
addr_a=169.254.79.1 addr_b=169.254.79.2 port=29510
netns_pair_up "$a" "$b" "$addr_a" "$addr_b" "$rate" >&2
cluster="{\"worker\": [\"$addr_a:$port\", \"$addr_b:$port\"]}"

# One worker alone, one thread: the baseline (one-BATCH.json).
one() {
  OMP_NUM_THREADS=1 "$dtrain" fit "$here/examples/configs/seed_transformer.json" --batch-size "$1" \
    --steps-per-epoch "$steps" --epochs 2 --threads 1 --verbose 0 --summary "$dir/one-$1.json" >"$dir/one.log" 2>&1 ||
    { cat "$dir/one.log" >&2; exit 1; }
}
# The two workers, BATCH rows each, with any further flags (two.json).
pair() {
  local batch=$1 i ns
  shift
  rm -f "$dir/two.json"
  for i in 0 1; do
    ns=$([ $i = 0 ] && echo "$a" || echo "$b")
    ip netns exec "$ns" env TF_CONFIG="{\"cluster\": $cluster, \"task\": {\"type\": \"worker\", \"index\": $i}}" \
      OMP_NUM_THREADS=1 DTRAIN_CLUSTER_TOKEN="seedtf-$tag-$batch-$*" \
      timeout 900 "$dtrain" fit "$here/examples/configs/seed_transformer.json" --strategy multi_worker \
      --batch-size $((batch * 2)) --steps-per-epoch "$steps" --epochs 2 --threads 1 --collective-timeout 300 \
      --verbose 0 --summary "$dir/two.json" "$@" >"$dir/worker-$i.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || { cat "$dir"/worker-*.log >&2; exit 1; }; done
  pids=()
}
# A column of a row of the doctor's scaling table, by its header's name.
column() {
  local report=$1 row=$2 name=$3 header
  header=$(grep -E '^\| workers \|' "$report" | head -1)
  local i
  i=$(awk -F'|' -v name="$name" '{for (i = 1; i <= NF; i++) { f = $i; gsub(/^ +| +$/, "", f); if (f == name) print i }}' <<<"$header")
  grep -E "^\\| $row \\| 1 \\|" "$report" | head -1 | awk -F'|' -v c="$i" '{gsub(/^ +| +$/, "", $c); print $c}'
}

echo "| link | batch per replica | flags | one worker samples/s | two workers samples/s | speedup | communication (exposed) | first finding |"
echo "|---|---|---|---|---|---|---|---|"
first_batch=${batches%% *}
for batch in $batches; do
  one "$batch"
  pair "$batch"
  report="$dir/doctor-$batch.txt"
  "$dtrain" doctor --runs "$dir/one-$batch.json,$dir/two.json" >"$report"
  finding=$(sed -n '/^Diagnosis/,$p' "$report" | grep -m1 '^- ' | cut -d: -f1 || true)
  echo "| $rate | $batch | - | $(column "$report" 1 samples/s) | $(column "$report" 2 samples/s) |" \
       "$(column "$report" 2 speedup) | $(column "$report" 2 'communication (exposed)') | ${finding:2} |"
  cp "$report" "/tmp/seed_transformer_doctor_$batch.txt"
done
# The doctor's fixes for the smallest batch, measured.
for fix in "--compression bf16" "--gradient-accumulation-steps 4"; do
  # shellcheck disable=SC2086 # the fix is two words
  pair "$first_batch" $fix
  report="$dir/doctor-fix.txt"
  "$dtrain" doctor --runs "$dir/one-$first_batch.json,$dir/two.json" >"$report"
  finding=$(sed -n '/^Diagnosis/,$p' "$report" | grep -m1 '^- ' | cut -d: -f1 || true)
  echo "| $rate | $first_batch | $fix | $(column "$report" 1 samples/s) | $(column "$report" 2 samples/s) |" \
       "$(column "$report" 2 speedup) | $(column "$report" 2 'communication (exposed)') | ${finding:2} |"
done
echo "(each batch's whole doctor report: /tmp/seed_transformer_doctor_BATCH.txt)"
