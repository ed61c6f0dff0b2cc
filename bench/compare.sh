#!/usr/bin/env bash
# dtrain against PyTorch (Debian's python3-torch) on the same three models, the same batch,
# optimizer and thread count, run side by side in one run: the four runs (two frameworks,
# two precisions) alternate, RUNS times, and the table gives medians and ratios of medians. PyTorch gets its best setting on
# these machines: OPENBLAS_NUM_THREADS=1 and torch.set_num_threads(T).
#
#   bench/compare.sh            (needs: make build; scripts/install-deps.sh --peers)
#   RUNS=5 THREADS="1 2" MODELS="seed_large" bench/compare.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${DTRAIN:-build/release/dtrain}
PY=/usr/bin/python3
RUNS=${RUNS:-3}
THREADS=${THREADS:-"1 2"}
MODELS=${MODELS:-"seed_small seed_large fashion_mnist"}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

[ -x "$BIN" ] || { echo "compare.sh: $BIN not found; run make build first" >&2; exit 1; }
$PY -c "import torch" 2>/dev/null || { echo "compare.sh: /usr/bin/python3 has no torch; run scripts/install-deps.sh --peers" >&2; exit 1; }

json_get() { $PY -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"; }
source bench/median.sh

# Comparable lengths: dtrain reports the median epoch after the first; PyTorch times
# steps after warm-up steps.
dtrain_args() {
  case $1 in
    seed_small) echo "--epochs 8" ;;      # 32 steps per epoch
    seed_large) echo "--epochs 3" ;;      # 157 steps per epoch
    fashion_mnist) echo "--epochs 5" ;;   # 469 steps per epoch
  esac
}
torch_args() {
  case $1 in
    seed_small) echo "--steps 200 --warmup 20" ;;
    seed_large) echo "--steps 200 --warmup 20" ;;
    fashion_mnist) echo "--epochs 5" ;;
  esac
}

# Each framework in float32 and in its bfloat16 mixed precision (dtrain: --dtype-policy
# mixed_bfloat16; PyTorch: torch.autocast on CPU). The last ratio sets dtrain's mixed
# precision against PyTorch's faster setting of the two.
echo "| model | threads | dtrain f32 | PyTorch f32 | f32 ratio | dtrain mixed_bfloat16 | PyTorch autocast bf16 | mixed / PyTorch's best | dtrain test acc (f32, mixed) | PyTorch test acc (f32, bf16) |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for model in $MODELS; do
  for t in $THREADS; do
    d32=() dmx=() p32=() pbf=() acc_ours="-" acc_theirs="-"
    for r in $(seq "$RUNS"); do
      for policy in float32 mixed_bfloat16; do
        "$BIN" fit "examples/configs/$model.json" --threads "$t" --verbose 0 --dtype-policy "$policy" \
          $(dtrain_args "$model") --summary "$tmp/d_$policy.json" > /dev/null
      done
      d32+=("$(json_get "$tmp/d_float32.json" samples_per_second)")
      dmx+=("$(json_get "$tmp/d_mixed_bfloat16.json" samples_per_second)")
      for cast in none bf16; do
        OPENBLAS_NUM_THREADS=1 $PY bench/peers/pytorch_train.py --model "$model" --threads "$t" --autocast "$cast" \
          $(torch_args "$model") > "$tmp/t_$cast.json"
      done
      p32+=("$(json_get "$tmp/t_none.json" samples_per_second)")
      pbf+=("$(json_get "$tmp/t_bf16.json" samples_per_second)")
    done
    if [ "$model" = fashion_mnist ]; then
      acc() { $PY -c "import json; print(round(json.load(open('$1'))['test']['accuracy'], 4))"; }
      acc_ours="$(acc "$tmp/d_float32.json"), $(acc "$tmp/d_mixed_bfloat16.json")"
      acc_theirs="$(json_get "$tmp/t_none.json" test_accuracy), $(json_get "$tmp/t_bf16.json" test_accuracy)"
    fi
    a=$(median "${d32[@]}") b=$(median "${p32[@]}") c=$(median "${dmx[@]}") d=$(median "${pbf[@]}")
    printf "| %s | %s | %.0f | %.0f | %.2f | %.0f | %.0f | %.2f | %s | %s |\n" "$model" "$t" "$a" "$b" \
      "$($PY -c "print($a / $b)")" "$c" "$d" "$($PY -c "print($c / max($b, $d))")" "$acc_ours" "$acc_theirs"
  done
done

# Resident memory over more than 1000 steps of the large model (7 epochs x 157 steps).
"$BIN" fit examples/configs/seed_large.json --epochs 7 --verbose 0 --summary "$tmp/rss.json" > /dev/null
echo
echo "dtrain seed_large, resident MiB after each of 7 epochs (1099 steps): $($PY -c \
  "import json; print(' '.join('%.1f' % v for v in json.load(open('$tmp/rss.json'))['epoch_rss_mb']))")"
