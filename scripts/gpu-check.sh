#!/usr/bin/env bash
# The checks that need a GPU: a preparation here, then commands on the GPU machine:
#
#   scripts/gpu-check.sh prepare   on a machine with the CUDA toolkit (no GPU needed): builds
#                                  the release preset, and packs into .gpu/ the GPU tests, the
#                                  GPU benchmark and the dtrain command (stripped), the Debian
#                                  libraries they load, and Fashion-MNIST.
#   scripts/gpu-check.sh run       on the GPU machine, from the repository's root with .gpu/
#                                  beside it: unpacks, finds CUDA's libraries, runs the GPU
#                                  tests (ctest's `gpu` label: test_conformance, test_gpu),
#                                  whole runs on Fashion-MNIST (the MLP to >= 88%, the residual
#                                  CNN to >= 92.5%, a run killed and resumed to the same
#                                  bytes), compute-sanitizer, TensorBoard's own reader over
#                                  the event files a run wrote,
#                                  the MLP benchmark beside PyTorch's, then prints one table.
#   scripts/gpu-check.sh bench     on the GPU machine, after run or alone (a command of its
#                                  own, to keep each under the device's 10 minutes): the
#                                  residual CNN and the transformer against PyTorch's best,
#                                  eager or torch.compile'd, and a table of the ratios.
#   scripts/gpu-check.sh strategies on the GPU machine, after run (its own command too): two
#                                  logical GPUs against one, two worker processes sharing
#                                  the GPU against PyTorch DDP, the doctor's prediction of them,
#                                  a parameter-server job whose worker trains on the GPU, and
#                                  GPU workers killed and stopped (test_multi_worker, test_ps).
#
# `run` needs none of dtrain's build dependencies: the GPU machine has CUDA's runtime
# libraries, a driver and PyTorch, and nothing else. .gpu/ is ignored by git, so it is
# carried by name (the device tool's `carry: [".gpu"]`). Everything each command prints
# also goes to $OUT/gpu-check.log (run), $OUT/gpu-bench.log (bench) or
# $OUT/gpu-strategies.log when OUT is set, each row as soon as it is known. Each command
# keeps to a budget (GPU_CHECK_SECONDS: 420 for run, 240 for bench, 310 for strategies), bounding every step by what is left and skipping, with a row that
# says so, what no longer fits, so the table always comes out. docs/gpu.md records each run.
set -uo pipefail
cd "$(dirname "$0")/.."
# The machine's own library path (its driver's libcuda may be found through it), for
# PyTorch, which must not see the bundle's libraries.
sys_ld=${LD_LIBRARY_PATH-}

prepare() {
  set -e
  local build=build/release
  cmake --preset release >/dev/null
  cmake --build --preset release --target test_conformance test_gpu bench_gpu_mlp bench_resnet bench_transformer \
    dtrain_command test_multi_worker multi_worker_task test_ps ps_task
  rm -rf .gpu
  mkdir -p .gpu/bundle/bin .gpu/bundle/lib .gpu/fashion-mnist
  for b in tests/test_conformance tests/test_gpu bench/bench_gpu_mlp bench/bench_resnet bench/bench_transformer dtrain \
           tests/test_multi_worker tests/multi_worker_task tests/test_ps tests/ps_task; do
    cp "$build/$b" .gpu/bundle/bin/
  done
  strip --strip-debug .gpu/bundle/bin/*
  # The libraries the binaries load from Debian (oneDNN, gRPC, Gloo, ...), and the C++
  # runtime they were built against; glibc and CUDA's own libraries come from the machine.
  ldd .gpu/bundle/bin/* | awk '/=> \// {print $3}' | sort -u |
    grep -v -E '/(libc|libm|libpthread|libdl|librt|libresolv)\.so|ld-linux|libcuda\.so' |
    while read -r lib; do cp -L "$lib" .gpu/bundle/lib/; done
  strip --strip-unneeded .gpu/bundle/lib/* 2>/dev/null || true
  tar -C .gpu -cJf .gpu/bundle.tar.xz bundle
  rm -rf .gpu/bundle
  cp /usr/share/datasets/fashion-mnist/*.gz .gpu/fashion-mnist/
  git rev-parse HEAD >.gpu/commit
  git status --porcelain --untracked-files=no | grep -q . && echo "(with uncommitted changes)" >>.gpu/commit
  echo "gpu-check: .gpu/ holds $(du -sh .gpu | cut -f1) for commit $(head -c 12 .gpu/commit)"
}

log=/dev/null
say() { echo "$@" | tee -a "$log"; }

# Each check adds a row (name, result, figures), said at once and tabled at the end.
rows=()
row() {
  rows+=("| $1 | $2 | $3 |")
  say "-> $1: $2 ($3)"
}

# The command's budget: `bound N` is N seconds or what is left of it (less 15 s for the
# table), `fits NAME [SECONDS]` adds a skipped row and fails when less than SECONDS (25 by
# default: what the step needs at the least) are left.
deadline=0
start_budget() { deadline=$((SECONDS + ${GPU_CHECK_SECONDS:-$1})); }
bound() {
  local left=$((deadline - SECONDS - 15))
  if ((left < $1)); then echo $((left > 1 ? left : 1)); else echo "$1"; fi
}
fits() {
  ((deadline - SECONDS >= ${2:-25})) && return 0
  row "$1" SKIPPED "no time left in the command's budget"
  return 1
}
# PyTorch with the machine's own libraries.
py() { env LD_LIBRARY_PATH="$sys_ld" PYTHONUNBUFFERED=1 python3 "$@"; }

# Unpacks the bundle once (into $root) and finds CUDA's libraries where this machine keeps
# them: the toolkit's folder or PyTorch's wheels.
root=/tmp/dtrain-gpu
setup() {
  [ -f .gpu/bundle.tar.xz ] || { say "gpu-check: no .gpu/bundle.tar.xz: run 'scripts/gpu-check.sh prepare' first and carry .gpu"; return 2; }
  # Without a GPU the tests would pass on their stand-in: nothing here would be checked.
  local gpus
  gpus=$(timeout 20 nvidia-smi -L 2>&1)
  echo "$gpus" | grep -q '^GPU' || { say "gpu-check: no GPU here (nvidia-smi -L: $gpus)"; return 2; }
  if [ ! -f "$root/commit" ] || ! cmp -s "$root/commit" .gpu/commit; then
    # Python's tarfile, which reads xz wherever Python is (the xz tool may not be there).
    rm -rf "$root" && mkdir -p "$root" &&
      py -c 'import sys, tarfile
kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
tarfile.open(sys.argv[1]).extractall(sys.argv[2], **kw)' .gpu/bundle.tar.xz "$root" &&
      cp .gpu/commit "$root/commit" || { say "gpu-check: could not unpack .gpu/bundle.tar.xz into $root"; return 2; }
  fi
  say "== commit $(cat .gpu/commit | tr '\n' ' ')"
  say "== $(date -u +%Y-%m-%dT%H:%M:%SZ) $(timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1)"
  local cuda_libs=""
  for pattern in 'libcublasLt.so.13' 'libcudnn.so.9' 'libnccl.so.2'; do
    local found
    found=$(timeout 30 find -L /usr/local/cuda*/lib* /usr/local/cuda*/targets/*/lib /usr/lib/x86_64-linux-gnu /opt /usr/local/lib \
                 -name "$pattern" -print -quit 2>/dev/null)
    [ -n "$found" ] && cuda_libs="$cuda_libs:$(dirname "$found")"
    say "   $pattern: ${found:-not found}"
  done
  export LD_LIBRARY_PATH="$root/bundle/lib$cuda_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export DTRAIN_FASHION_MNIST_DIR=$PWD/.gpu/fashion-mnist
}

table() {
  say ""
  say "| check | result | figures |"
  say "|---|---|---|"
  for r in "${rows[@]}"; do say "$r"; done
}

run() {
  [ -n "${OUT:-}" ] && log="$OUT/gpu-check.log" && : >"$log"
  start_budget 420
  setup || exit 2
  local bin=$root/bundle/bin

  # 1. The GPU tests: every primitive against the CPU backend and a double reference, and
  # placement, copies, fit, checkpoints and out-of-memory on the GPU.
  for t in test_conformance test_gpu; do
    fits "$t" || continue
    say "== $t"
    local out
    out=$(timeout "$(bound 200)" "$bin/$t" 2>&1)
    local rc=$?
    echo "$out" | tee -a "$log" | tail -25
    local passed failed skipped cuda_skipped result
    passed=$(echo "$out" | grep -oP '\[  PASSED  \] \K[0-9]+' | tail -1)
    failed=$(echo "$out" | grep -oP '\[  FAILED  \] \K[0-9]+(?= test)' | tail -1)
    skipped=$(echo "$out" | grep -oP '\[  SKIPPED \] \K[0-9]+(?= test)' | tail -1)
    # A CUDA case that skipped itself did not see the GPU.
    cuda_skipped=$(echo "$out" | grep -oE '^\[  SKIPPED \] [^ ,]*/cuda' | sort -u | wc -l)
    result=passed
    [ $rc -ne 0 ] && result="FAILED (exit $rc)"
    [ "$cuda_skipped" -gt 0 ] && result="FAILED ($cuda_skipped CUDA cases skipped)"
    row "$t" "$result" "${passed:-0} passed, ${failed:-0} failed, ${skipped:-0} skipped"
  done

  # 2. Whole runs on Fashion-MNIST: the MLP config on the GPU, its test accuracy; then the
  # same run killed at a step and resumed from its checkpoint, against an uninterrupted one.
  local acc
  if fits "Fashion-MNIST MLP, 10 epochs"; then
  say "== fashion_mnist MLP on the GPU"
  local fit_out
  fit_out=$(timeout "$(bound 120)" "$bin/dtrain" fit examples/configs/fashion_mnist.json --device gpu --verbose 2 \
            --summary /tmp/fm.json 2>&1)
  echo "$fit_out" | tee -a "$log" | tail -8
  acc=$(echo "$fit_out" | grep -oP '^test:.*accuracy \K[0-9.]+' | tail -1)
  row "Fashion-MNIST MLP, 10 epochs" "$(awk -v a="${acc:-0}" 'BEGIN {print (a >= 0.88 ? "passed" : "FAILED")}')" \
      "test accuracy ${acc:-none} (>= 0.88 asked)"
  # Its steps after the first two replay CUDA graphs; the summary says how many, or why not.
  local graphs
  graphs=$(python3 -c 'import json,sys; g=json.load(open(sys.argv[1])).get("cuda_graph",{}); print(g.get("replays",0), g.get("not_used","") or "-")' \
           /tmp/fm.json 2>/dev/null)
  row "CUDA graphs in the MLP run" "$([ "${graphs%% *}" -gt 0 ] 2>/dev/null && echo used || echo "NOT USED")" \
      "${graphs:-no summary} (replays, why not)"
  fi
  if fits "Fashion-MNIST residual CNN, 12 epochs"; then
  say "== the residual CNN on Fashion-MNIST on the GPU"
  local cnn_out
  cnn_out=$(timeout "$(bound 180)" "$bin/dtrain" fit examples/configs/fashion_mnist_resnet.json --device gpu --verbose 2 2>&1)
  echo "$cnn_out" | tee -a "$log" | tail -5
  acc=$(echo "$cnn_out" | grep -oP '^test:.*accuracy \K[0-9.]+' | tail -1)
  row "Fashion-MNIST residual CNN, 12 epochs" \
      "$(awk -v a="${acc:-0}" 'BEGIN {print (a >= 0.925 ? "passed" : "FAILED")}')" "test accuracy ${acc:-none} (>= 0.925 asked)"
  local cnn_graph
  cnn_graph=$(echo "$cnn_out" | grep -oP 'not as a CUDA graph: \K.*' | head -1)
  row "CUDA graphs in the CNN run (cuDNN)" "$([ -z "$cnn_graph" ] && echo used || echo "NOT USED")" "${cnn_graph:-replayed}"
  fi
  if fits "killed at step 300, resumed" 90; then
  say "== a run killed at step 300 and resumed, against one uninterrupted"
  rm -rf /tmp/ck /tmp/whole.safetensors /tmp/resumed.safetensors
  local common=(fit examples/configs/fashion_mnist.json --device gpu --epochs 2 --verbose 0)
  timeout "$(bound 60)" "$bin/dtrain" "${common[@]}" --save-weights /tmp/whole.safetensors >>"$log" 2>&1
  timeout "$(bound 60)" "$bin/dtrain" "${common[@]}" --checkpoint-dir /tmp/ck --checkpoint-every 100 \
    --fault-kill worker:0:300 >>"$log" 2>&1
  timeout "$(bound 60)" "$bin/dtrain" "${common[@]}" --checkpoint-dir /tmp/ck --checkpoint-every 100 \
    --save-weights /tmp/resumed.safetensors >>"$log" 2>&1
  if cmp -s /tmp/whole.safetensors /tmp/resumed.safetensors; then
    row "killed at step 300, resumed" passed "weights equal to the uninterrupted run's, byte for byte"
  else
    row "killed at step 300, resumed" FAILED "weights differ from the uninterrupted run's (or a run failed: see the log)"
  fi
  fi

  # 3. compute-sanitizer over the CUDA backend's conformance tests: memcheck over them all,
  # racecheck over dtrain's kernels that share memory within a block (sums, softmax, layer
  # norm, batch norm's sums; cuDNN's own kernels are left out).
  local -A filters=([memcheck]='*/cuda:-*TensorsPastTwoGibibytes*'
                    [racecheck]='*Reduction*/cuda:*Softmax*/cuda:*LayerNorm*/cuda:*BatchNorm*/cuda')
  for tool in memcheck racecheck; do
    fits "compute-sanitizer $tool" || continue
    say "== compute-sanitizer --tool $tool"
    local s_out
    s_out=$(timeout "$(bound 120)" compute-sanitizer --tool "$tool" --error-exitcode 3 "$bin/test_conformance" \
            --gtest_filter="${filters[$tool]}" --gtest_brief=1 2>&1)
    local src=$?
    echo "$s_out" | tail -6 | tee -a "$log"
    local summary
    summary=$(echo "$s_out" | grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' | tail -1)
    if echo "$s_out" | grep -q 'Device not supported'; then
      row "compute-sanitizer $tool" "not run" "this machine's GPU is not supported by compute-sanitizer"
    else
      row "compute-sanitizer $tool" "$([ $src -eq 0 ] && echo clean || echo "FAILED (exit $src)")" "${summary:-no summary}"
    fi
  done

  # 4. TensorBoard's own event reader (this machine has the tensorboard package) over the
  # files dtrain fit --tensorboard wrote, CRCs and protocol buffers included.
  if fits "TensorBoard reads dtrain's event files"; then
  say "== TensorBoard's reader"
  rm -rf /tmp/tb
  timeout "$(bound 60)" "$bin/dtrain" fit examples/configs/fashion_mnist.json --device gpu --epochs 2 --verbose 0 \
    --tensorboard /tmp/tb >>"$log" 2>&1
  local tb_out
  tb_out=$(timeout "$(bound 60)" env LD_LIBRARY_PATH="$sys_ld" python3 scripts/read-tensorboard-events.py /tmp/tb 2 2>&1)
  local tb_rc=$?
  echo "$tb_out" | tail -4 | tee -a "$log"
  row "TensorBoard reads dtrain's event files" "$([ $tb_rc -eq 0 ] && echo passed || echo "FAILED (exit $tb_rc)")" \
      "$(echo "$tb_out" | grep -c 'epoch_loss at steps') runs read"
  fi

  # 5. The benchmark, dtrain then PyTorch on the same GPU (their tables in the log).
  if fits "bench_gpu_mlp and PyTorch's" 60; then
  say "== bench_gpu_mlp"
  timeout "$(bound 120)" "$bin/bench_gpu_mlp" --quick 2>&1 | tee -a "$log"
  local b_rc=${PIPESTATUS[0]}
  say "== PyTorch (bench/peers/pytorch_gpu_mlp.py)"
  timeout "$(bound 120)" env LD_LIBRARY_PATH="$sys_ld" PYTHONUNBUFFERED=1 python3 bench/peers/pytorch_gpu_mlp.py --quick 2>&1 |
    tee -a "$log"
  local p_rc=${PIPESTATUS[0]}
  row "bench_gpu_mlp and PyTorch's" "$([ "$b_rc" -eq 0 ] && [ "$p_rc" -eq 0 ] && echo ran || echo "FAILED (exits $b_rc, $p_rc)")" \
      "their tables above and in the log"
  fi

  table
}

# The benchmarks against PyTorch's best (eager or torch.compile'd) on the same GPU, a
# command of their own: the residual CNN in mixed bfloat16 (1.1x asked) and the transformer
# encoder at lengths 128 and 512 (1.2x asked). Needs run's unpacked bundle.
bench() {
  [ -n "${OUT:-}" ] && log="$OUT/gpu-bench.log" && : >"$log"
  start_budget 240
  setup || exit 2
  local bin=$root/bundle/bin
  # ratio_row NAME TARGET DTRAIN_OUTPUT PYTORCH_OUTPUT: dtrain's samples/s against PyTorch's best.
  ratio_row() {
    local ours best
    ours=$(echo "$3" | grep -oP '"samples_per_second":\K[0-9.e+]+' | tail -1)
    best=$(echo "$4" | grep -oP '"samples_per_second": \K[0-9.e+]+' | sort -g | tail -1)
    row "$1" "$(awk -v a="${ours:-0}" -v b="${best:-0}" -v t="$2" 'BEGIN {print (b > 0 && a >= t * b ? "passed" : "FAILED")}')" \
        "dtrain ${ours:-none} samples/s, PyTorch's best ${best:-none} ($(awk -v a="${ours:-0}" -v b="${best:-0}" \
        'BEGIN {printf (b > 0 ? "%.2fx" : "no ratio"), (b > 0 ? a / b : 0)}'); ${2}x asked)"
  }
  local r_out p_out
  if fits "residual CNN step, bf16, batch 256" 100; then
  say "== bench_resnet --gpu --bf16"
  r_out=$(timeout "$(bound 60)" "$bin/bench_resnet" --gpu --bf16 --batch 256 --steps 50 2>&1)
  echo "$r_out" | tee -a "$log"
  say "== PyTorch (bench/peers/pytorch_resnet.py --device cuda --bf16 --compile)"
  p_out=$(timeout "$(bound 100)" env LD_LIBRARY_PATH="$sys_ld" python3 bench/peers/pytorch_resnet.py --device cuda \
            --bf16 --compile --batch 256 --steps 50 2>&1)
  echo "$p_out" | tail -4 | tee -a "$log"
  ratio_row "residual CNN step, bf16, batch 256" 1.1 "$r_out" "$p_out"
  fi
  for shape in "128 64" "512 16"; do
    set -- $shape
    fits "transformer step, length $1, batch $2" 80 || continue
    say "== bench_transformer --gpu --length $1 --batch $2"
    r_out=$(timeout "$(bound 45)" "$bin/bench_transformer" --gpu --length "$1" --batch "$2" --steps 30 2>&1)
    echo "$r_out" | tee -a "$log"
    say "== PyTorch (bench/peers/pytorch_transformer.py --device cuda --compile --length $1 --batch $2)"
    p_out=$(timeout "$(bound 90)" env LD_LIBRARY_PATH="$sys_ld" python3 bench/peers/pytorch_transformer.py --device cuda \
              --compile --length "$1" --batch "$2" --steps 30 2>&1)
    echo "$p_out" | tail -4 | tee -a "$log"
    ratio_row "transformer step, length $1, batch $2" 1.2 "$r_out" "$p_out"
  done
  table
}

# The samples/s of a fit --summary file (empty where it has none).
summary_rate() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["samples_per_second"])' "$1" 2>/dev/null; }
# against_row NAME TARGET A B WORDS_A WORDS_B: passed where A >= TARGET x B (samples/s), with
# both figures and their ratio.
against_row() {
  row "$1" "$(awk -v a="${3:-0}" -v b="${4:-0}" -v t="$2" 'BEGIN {print (b > 0 && a >= t * b ? "passed" : "FAILED")}')" \
      "$5 ${3:-none} samples/s, $6 ${4:-none} ($(awk -v a="${3:-0}" -v b="${4:-0}" \
      'BEGIN {printf (b > 0 ? "%.2fx" : "no ratio"), (b > 0 ? a / b : 0)}'); ${2}x asked)"
}

# The strategies on the GPU, a command of their own: two logical GPUs against the GPU alone
# (0.9x asked), two worker processes sharing it against PyTorch DDP (1.5x asked), and the
# doctor's prediction of those workers (15%). Needs run's unpacked bundle.
strategies() {
  [ -n "${OUT:-}" ] && log="$OUT/gpu-strategies.log" && : >"$log"
  start_budget 310
  setup || exit 2
  local bin=$root/bundle/bin
  # MirroredStrategy on two logical GPUs of the one GPU against the GPU alone, on the same
  # global batch, both kernel by kernel (0.9x asked: the sum on the device adds little).
  if fits "two logical GPUs against one (MLP)" 50; then
  say "== the MLP config on cuda:0 alone, then on two logical GPUs of it"
  local common=(fit examples/configs/fashion_mnist.json --epochs 3 --cuda-graph off)
  timeout "$(bound 40)" "$bin/dtrain" "${common[@]}" --device gpu --verbose 0 --summary /tmp/one_gpu.json >>"$log" 2>&1
  timeout "$(bound 40)" "$bin/dtrain" "${common[@]}" --strategy mirrored --device cuda:0 --replicas 2 --verbose 2 \
    --summary /tmp/two_logical.json >/tmp/two_logical.out 2>&1
  head -3 /tmp/two_logical.out | tee -a "$log"
  against_row "two logical GPUs against one (MLP)" 0.9 "$(summary_rate /tmp/two_logical.json)" \
    "$(summary_rate /tmp/one_gpu.json)" "two logical GPUs" "one GPU"
  fi
  # Two worker processes sharing the GPU (their sums staged through host memory: NCCL
  # refuses two ranks on one GPU) against PyTorch DDP alike (its gloo backend; 1.5x asked),
  # and the doctor's prediction of them from one worker at their per-worker batch (15%).
  if fits "two GPU workers sharing the GPU against PyTorch DDP" 100; then
  say "== two multi_worker processes on cuda:0, then PyTorch DDP (gloo) alike"
  local fm=(fit examples/configs/fashion_mnist.json --epochs 3 --cuda-graph off --device cuda:0)
  timeout "$(bound 40)" "$bin/dtrain" launch --workers 2 "${fm[@]}" --strategy multi_worker --verbose 2 \
    --summary /tmp/two_workers.json >/tmp/two_workers.out 2>&1
  grep -m 3 -E 'MultiWorkerMirroredStrategy|error' /tmp/two_workers.out | tee -a "$log"
  local ddp
  ddp=$(timeout "$(bound 60)" env LD_LIBRARY_PATH="$sys_ld" python3 bench/peers/pytorch_ddp_gpu.py 2>&1 | tee -a "$log" |
        grep -oP '"samples_per_second": \K[0-9.e+]+' | tail -1)
  against_row "two GPU workers sharing the GPU against PyTorch DDP" 1.5 "$(summary_rate /tmp/two_workers.json)" "$ddp" \
    "dtrain" "DDP (gloo)"
  fi
  if fits "the doctor's prediction of the two GPU workers" 40; then
  say "== the doctor: the two workers predicted from one worker on the GPU at 64 rows"
  timeout "$(bound 30)" "$bin/dtrain" fit examples/configs/fashion_mnist.json --epochs 3 --cuda-graph off --device cuda:0 \
    --batch-size 64 --verbose 0 --summary /tmp/one_worker.json >>"$log" 2>&1
  local probe what_if check
  probe=$(timeout "$(bound 30)" "$bin/dtrain" launch --workers 2 probe-link --device cuda:0 2>&1 | tee -a "$log" |
          grep -oP -- '--what-if \K\S+' | head -1)
  what_if=${probe:+--what-if $probe}
  check=$(timeout "$(bound 30)" "$bin/dtrain" doctor --runs /tmp/one_worker.json,/tmp/two_workers.json $what_if 2>&1 |
          tee -a "$log" | grep -m 1 -E '^\| 2 \| 1 \|')
  local err
  err=$(echo "$check" | awk -F'|' '{gsub(/[ %+]/, "", $6); print $6}')
  row "the doctor's prediction of the two GPU workers" \
      "$(awk -v e="${err:-999}" 'BEGIN {print (e != 999 && e <= 15 && e >= -15 ? "passed" : "FAILED")}')" \
      "model check error ${err:-none}% (within 15% asked; --what-if ${probe:-none: the link was not measured})"
  fi
  # GPU workers' faults on the GPU: a multi_worker worker killed or stopped is named by the
  # other, and a parameter-server worker killed or hung has its closure run elsewhere
  # (the tests' task programs from the bundle; the other processes share the GPU).
  if fits "GPU workers killed and stopped" 90; then
  say "== GPU workers killed and stopped (test_multi_worker, test_ps)"
  local f_out f_rc=0
  f_out=$(DTRAIN_MULTI_WORKER_TASK=$bin/multi_worker_task timeout "$(bound 40)" "$bin/test_multi_worker" \
            --gtest_filter='MultiWorker.AKilledOrStoppedGpuWorker*' --gtest_brief=1 2>&1) || f_rc=$?
  f_out+=$'\n'$(DTRAIN_PS_TASK=$bin/ps_task timeout "$(bound 45)" "$bin/test_ps" \
            --gtest_filter='ParameterServerFaults.AWorkerKilled*:ParameterServerFaults.AHung*' --gtest_brief=1 2>&1) ||
    f_rc=$?
  echo "$f_out" | tail -8 | tee -a "$log"
  row "GPU workers killed and stopped" "$([ $f_rc -eq 0 ] && echo passed || echo "FAILED (exit $f_rc)")" \
      "$(echo "$f_out" | grep -oP '\[  PASSED  \] \K[0-9]+' | awk '{n += $1} END {print n + 0}') tests passed"
  fi
  # ParameterServerStrategy in TensorFlow's layout: a worker training on the GPU, its pulls
  # and pushes through page-locked memory, the chief and the ps on the CPU.
  if fits "a parameter-server job with a GPU worker" 30; then
  say "== a chief, a ps and a worker on cuda:0"
  local ps_out ps_rc
  ps_out=$(timeout "$(bound 25)" "$bin/dtrain" launch --workers 1 --ps 1 fit examples/configs/fashion_mnist.json \
           --epochs 1 --device cuda:0 --verbose 1 2>&1)
  ps_rc=$?
  echo "$ps_out" | grep -E 'ParameterServerStrategy|error|test:' | head -5 | tee -a "$log"
  local on_gpu
  on_gpu=$(echo "$ps_out" | grep -c 'this is worker:0, on cuda:0')
  row "a parameter-server job with a GPU worker" \
      "$([ $ps_rc -eq 0 ] && [ "$on_gpu" -gt 0 ] && echo passed || echo "FAILED (exit $ps_rc)")" \
      "$(echo "$ps_out" | grep -oP '^test:.*accuracy [0-9.]+' | tail -1 || echo "no test line")"
  fi
  table
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  bench) bench ;;
  strategies) strategies ;;
  *) echo "usage: scripts/gpu-check.sh prepare|run|bench|strategies" >&2; exit 2 ;;
esac
