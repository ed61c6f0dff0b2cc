#!/usr/bin/env bash
# How close the doctor's model check comes to the step times it predicts, over the runs
# this machine can make: 2 and 4 replicas in one process (MirroredStrategy, sharing a
# thread per core); 2 to 4 workers on one host (which sum through shared memory; WHERE
# names them loopback, the link their probe measures); and 2 workers as two "hosts" in
# network namespaces joined by links limited with tbf (each pinned to a core of its own,
# as two one-core machines), under all-reduce and under one and two ps. Each with and
# without a straggler (worker 1 made 2x slower with --fault-slow), but for two ps. Per
# case and round: the job at one worker (pinned as one of the case's workers is), the
# job at N workers (N times the rows per step), `dtrain probe-link` between them, then
# `dtrain doctor --runs ONE,N --what-if LINK` (without a link for replicas in one
# process), whose model check gives measured and predicted samples/s, and the run replayed
# from its own steps (each step's measured work, communication and waits from the model). Prints a markdown
# table of the medians over the rounds; --update-docs also writes it into
# docs/profiling.md between its whatif-accuracy markers. About 25 minutes (ROUNDS=5: 40).
# Needs root for the namespaces (without root, only the one-process and one-host cases run).
#
#   bench/whatif_accuracy.sh [--update-docs]   ROUNDS=3 RATES="20mbit 100mbit 1gbit" WHERE=all|mirrored|loopback|namespaces|ps
#   KEEP=DIR keeps each round's runs and link (DIR/NNN/: one.json, many.json, link, case);
#   FROM=DIR checks the model again on rounds so kept (the same WHERE, RATES and ROUNDS),
#   measuring nothing: a change to the model tried on the same runs, in seconds.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
dtrain="$here/build/release/dtrain"
config="$here/examples/configs/fashion_mnist.json"
[ -x "$dtrain" ] || { echo "whatif_accuracy.sh: build first (make build): $dtrain is missing" >&2; exit 1; }
update_docs=no
[ "${1:-}" = --update-docs ] && update_docs=yes
if [ $update_docs = yes ] && [ "${WHERE:-all}" != all ]; then
  echo "whatif_accuracy.sh: --update-docs writes the whole table: leave WHERE unset (all)" >&2
  exit 2
fi
rounds=${ROUNDS:-3}
rows=1024  # per worker per step
# Steps per epoch: where a step takes milliseconds, 100 (two measured epochs of about a
# second or more, so that a slow spell of this machine does not make a case's figure);
# on the 20 and 100 Mbit/s links, whose steps take 0.1 to 1.5 s, 10.
steps_of() { case $1 in 20mbit | 100mbit) echo 10 ;; *) echo 100 ;; esac; }
# tbf's bucket: one GSO packet (64 KiB), what the link sends at once after a rest, which
# probe-link measures and the model gives every transfer after one. At 1 Gbit/s two: a
# bucket of one packet refills in 0.5 ms, near the latency of the qdisc's timer, and a
# kernel that wakes it late (6.18 on AMD EPYC) then carried 580 Mbit/s where the link was
# to carry 1 Gbit/s (925 with two packets).
burst_of() { case $1 in 1gbit) echo 128kb ;; *) echo 64kb ;; esac; }
train_rows=60000  # Fashion-MNIST's training set
# A run's fit command for ROWS rows a step: epochs of steps_of's steps, or of as many whole
# batches as the training set holds where that is fewer (58 of one worker's 1024 rows, 29
# of two workers', 19 of three, 14 of four: an epoch of in-memory data ends with its rows),
# and after the warm-up epoch as many as give two epochs of steps_of's steps (200 steps at
# four workers as at one, where three epochs gave 28). ROWS 0: a pipeline that does not end
# with the training set (the ps's closures), epochs of steps_of's steps. Sets fit;
# WHERE (the link) is the calling case_row's.
fit=()
fit_for() {
  local per steps
  per=$(steps_of "$where")
  steps=$per
  [ "$1" = 0 ] || [ $((train_rows / $1)) -ge "$per" ] || steps=$((train_rows / $1))
  fit=(fit "$config" --epochs $((1 + (2 * per + steps - 1) / steps)) --steps-per-epoch "$steps" --verbose 0)
}
. "$here/scripts/netns_pair.sh"
a=dtrain_wia_a b=dtrain_wia_b
addr_a=169.254.81.1 addr_b=169.254.81.2 port=29460
# Under the ps: the two workers, the ps (a second one for the cases of two) and the chief,
# each a host on a switch.
hub=dtrain_wia_hub
hosts=(dtrain_wia_w0 dtrain_wia_w1 dtrain_wia_ps dtrain_wia_chief dtrain_wia_ps1)
star_addr() { echo "169.254.78.$(($1 + 1)):$port"; }  # of hosts[i]
dir=$(mktemp -d)
trap 'netns_pair_down "$a" "$b"; netns_star_down "$hub" "${hosts[@]}"; rm -rf "$dir"' EXIT
namespaces=yes
[ "$(id -u)" = 0 ] || namespaces=no
kept_next=0  # with FROM: the next kept round
if [ -n "${FROM:-}" ]; then
  [ -e "$FROM/day" ] || { echo "whatif_accuracy.sh: FROM=$FROM holds no rounds kept with KEEP" >&2; exit 2; }
  namespaces=yes  # the runs were made; nothing is set up
  netns_pair_up() { :; }
  netns_pair_down() { :; }
  netns_star_up() { :; }
  netns_star_down() { :; }
fi

# The job at one worker, beside a twin of it on the other core (each on a core of its own
# where PIN is yes): the two cores of this machine share caches, memory and perhaps a
# physical core, so that a worker computes slower while the other core computes too. The
# workers of a case see that sharing; the model's machines would not, so the one-worker
# run it starts from is measured under the same sharing.
reference() {
  local pin=$1 i twin=() pids=()
  fit_for $rows
  for i in 0 1; do
    [ "$pin" = yes ] && twin=(taskset -c "$i") || twin=()
    OMP_NUM_THREADS=1 "${twin[@]}" "$dtrain" "${fit[@]}" --threads 1 --batch-size $rows --summary "$dir/one-$i.json" >/dev/null &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || { echo "whatif_accuracy.sh: the one-worker run failed" >&2; exit 1; }; done
  mv "$dir/one-0.json" "$dir/one.json"
}

# One round of a case: prints "measured predicted replayed link why" from the doctor's model check.
# WHERE is loopback or a tbf rate; SLOW is none or a --fault-slow.
round() {
  local workers=$1 where=$2 slow=$3 fault=()
  [ "$slow" = none ] || fault=(--fault-slow "$slow")
  rm -f "$dir/one.json" "$dir/many.json" "$dir/out-worker0.log"
  if [ "$where" = loopback ]; then
    reference no
    fit_for $((rows * workers))
    OMP_NUM_THREADS=1 "$dtrain" launch --workers "$workers" "${fit[@]}" --threads 1 --strategy multi_worker \
      --batch-size $((rows * workers)) --summary "$dir/many.json" "${fault[@]}" >/dev/null
    OMP_NUM_THREADS=1 "$dtrain" launch --workers "$workers" probe-link >"$dir/out-worker0.log" 2>&1
  else
    reference yes
    fit_for $((rows * 2))
    local pair="{\"worker\": [\"$addr_a:$port\", \"$addr_b:$port\"]}"
    on_hosts "$pair" "worker:0:$a worker:1:$b" "$dtrain" "${fit[@]}" --threads 1 --strategy multi_worker \
      --batch-size $((rows * 2)) --summary "$dir/many.json" "${fault[@]}"
    on_hosts "$pair" "worker:0:$a worker:1:$b" "$dtrain" probe-link
  fi
  check_row
}

# The doctor's model check of many.json from one.json, with the link worker 0's probe
# printed (none for replicas in one process): "measured predicted replayed link why".
check_row() {
  local link=link=- what_if=()
  if [ -e "$dir/out-worker0.log" ]; then
    link=$(grep -o 'link=[^ ]*' "$dir/out-worker0.log" | head -1)
    what_if=(--what-if "$link")
  fi
  "$dtrain" doctor --runs "$dir/one.json,$dir/many.json" "${what_if[@]}" >"$dir/doctor.txt"
  if [ -n "${KEEP:-}" ]; then
    local kept
    [ -e "$KEEP/day" ] || { mkdir -p "$KEEP" && date -u +%Y-%m-%d >"$KEEP/day"; }
    kept="$KEEP/$(printf %03d "$(find "$KEEP" -mindepth 1 -maxdepth 1 -type d 2>/dev/null | wc -l)")"
    mkdir -p "$kept"
    cp "$dir/one.json" "$dir/many.json" "$kept/"
    echo "${link#link=}" >"$kept/link"
    echo "$case_label" >"$kept/case"
  fi
  # | workers | replicas | measured | predicted | error | replayed | error | compute | why |
  grep -q "^Model check" "$dir/doctor.txt" || {
    cat "$dir/doctor.txt" >&2
    echo "whatif_accuracy.sh: the doctor checked no model (above)" >&2
    exit 1
  }
  grep -A3 "^Model check" "$dir/doctor.txt" | tail -1 |
    awk -F' [|] ' -v link="${link#link=}" '{ sub(/ [|]$/, "", $9); print $3, $4, $6, link, $9 }'
}

# One round of MirroredStrategy, as `dtrain doctor --replicas 1,R` runs it: one replica with
# a thread per core, then REPLICAS replicas sharing those threads in one process.
mirrored_round() {
  local replicas=$1 cores
  cores=$(nproc)
  rm -f "$dir/one.json" "$dir/many.json" "$dir/out-worker0.log"
  fit_for $rows
  OMP_NUM_THREADS=$cores "$dtrain" "${fit[@]}" --threads "$cores" --batch-size $rows --summary "$dir/one.json" >/dev/null
  fit_for $((rows * replicas))
  OMP_NUM_THREADS=$cores "$dtrain" "${fit[@]}" --threads "$cores" --strategy mirrored --replicas "$replicas" \
    --batch-size $((rows * replicas)) --summary "$dir/many.json" >/dev/null
  check_row
}

# Runs TASKS ("type:index:namespace ...") of the cluster CLUSTER, each "$@" in its
# namespace, a worker pinned to the core of its index; task T writes out-T.log.
on_hosts() {
  local cluster=$1 tasks=$2 pids=() t type index ns pin token="wia-$RANDOM"
  shift 2
  for t in $tasks; do
    IFS=: read -r type index ns <<<"$t"
    pin=()
    [ "$type" = worker ] && pin=(taskset -c "$index")
    ip netns exec "$ns" env TF_CONFIG="{\"cluster\": $cluster, \"task\": {\"type\": \"$type\", \"index\": $index}}" \
      OMP_NUM_THREADS=1 DTRAIN_CLUSTER_TOKEN="$token" "${pin[@]}" "$@" >"$dir/out-$type$index.log" 2>&1 &
    pids+=($!)
  done
  local failed=0
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
  [ $failed = 0 ] || { cat "$dir"/out-*.log >&2; exit 1; }
}

# One round under PS_COUNT ps (1 or 2; 2 workers, CONSISTENCY) on the star: "measured
# predicted replayed link why", as round prints.
ps_round() {
  local consistency=$1 slow=$2 ps_count=$3 fault=()
  [ "$slow" = none ] || fault=(--fault-slow "$slow")
  local ps="\"$(star_addr 2)\"" ps_tasks="ps:0:${hosts[2]}"
  local split=()  # two ps each hold half of every variable
  [ "$ps_count" = 1 ] || { ps+=", \"$(star_addr 4)\"" ps_tasks+=" ps:1:${hosts[4]}" split=(--partitioner fixed:2); }
  rm -f "$dir/one.json" "$dir/many.json" "$dir/out-worker0.log"
  reference yes
  fit_for 0  # a closure is one step of 1024 rows, from a pipeline
  on_hosts "{\"chief\": [\"$(star_addr 3)\"], \"worker\": [\"$(star_addr 0)\", \"$(star_addr 1)\"], \"ps\": [$ps]}" \
    "chief:0:${hosts[3]} worker:0:${hosts[0]} worker:1:${hosts[1]} $ps_tasks" "$dtrain" "${fit[@]}" --threads 1 --strategy parameter_server \
    --consistency "$consistency" --batch-size $rows --summary "$dir/many.json" "${fault[@]}" "${split[@]}"
  on_hosts "{\"worker\": [\"$(star_addr 0)\", \"$(star_addr 1)\"]}" "worker:0:${hosts[0]} worker:1:${hosts[1]}" \
    "$dtrain" probe-link
  check_row
}

# With FROM: the next kept round of the case, checked again ("measured predicted replayed
# link why", as round prints).
kept_round() {
  local from
  from="$FROM/$(printf %03d "$kept_next")"
  kept_next=$((kept_next + 1))
  [ -e "$from/case" ] && [ "$(cat "$from/case")" = "$case_label" ] || {
    echo "whatif_accuracy.sh: $from is not a round of '$case_label' (were FROM's rounds kept with other" \
      "WHERE, RATES or ROUNDS?)" >&2
    exit 1
  }
  cp "$from/one.json" "$from/many.json" "$dir/"
  rm -f "$dir/out-worker0.log"
  [ "$(cat "$from/link")" = - ] || echo "link=$(cat "$from/link")" >"$dir/out-worker0.log"
  check_row
}

# Medians over the rounds, as a table row. WORKERS "ps:CONSISTENCY:PS" is a case of PS
# ps, "mirrored:R" R replicas in one process.
case_row() {
  local label=$1 workers=$2 where=$3 slow=$4 r _ consistency ps_count
  case_label="$label | $workers | $slow"
  : >"$dir/rounds"
  for r in $(seq "$rounds"); do
    case ${FROM:+kept}$workers in
      kept*) kept_round ;;
      ps:*) IFS=: read -r _ consistency ps_count <<<"$workers"; ps_round "$consistency" "$slow" "$ps_count" ;;
      mirrored:*) mirrored_round "${workers#mirrored:}" ;;
      *) round "$workers" "$where" "$slow" ;;
    esac >>"$dir/rounds"
  done
  python3 - "$label" "$workers" "$slow" "$dir/rounds" <<'EOF'
import statistics, sys
label, workers, slow, path = sys.argv[1:]
rows = [line.split(" ", 4) for line in open(path) if line.strip()]
measured = statistics.median(float(r[0]) for r in rows)
predicted = statistics.median(float(r[1]) for r in rows)
errors = [(float(r[1]) - float(r[0])) / float(r[0]) for r in rows]
error = (predicted - measured) / measured
worst = max(errors, key=abs)
replays = [float(r[2]) for r in rows if r[2] != "-"]
replayed = (statistics.median(replays) - measured) / measured if len(replays) == len(rows) else None
replay = f"{replayed:+.1%}" if replayed is not None else "-"
link = rows[len(rows) // 2][3]
# Why, in the words of one round: where the medians miss by more than 15%, of the rounds
# that missed by as much (and whose replay did, where its median does) the one whose error
# is nearest the median error; where only the replay's median does, the round whose replay
# is nearest it; where only some round misses, the worst one.
def why(r):
    text = r[4].strip()
    return "not known" if text in ("-", "") else text
missed = [k for k in range(len(rows)) if abs(errors[k]) > 0.15] or list(range(len(rows)))
if replayed is not None and abs(replayed) > 0.15:  # of those, one whose replay missed too
    missed = [k for k in missed if abs(float(rows[k][2]) - measured) / measured > 0.15] or missed
nearest = min(missed, key=lambda k: abs(errors[k] - statistics.median(errors)))
if abs(error) > 0.15:
    whys = why(rows[nearest])
elif replayed is not None and abs(replayed) > 0.15:
    whys = why(min(rows, key=lambda r: abs((float(r[2]) - measured) / measured - replayed)))
elif abs(worst) > 0.15:
    whys = f"the worst round ({worst:+.1%}): " + why(rows[errors.index(worst)])
else:
    whys = "-"
straggler = "-" if slow == "none" else "worker:1 2x"
if workers.startswith("ps:"):
    _, consistency, ps_count = workers.split(":")
    workers = f"2, {ps_count} ps, {consistency}"
elif workers.startswith("mirrored:"):
    workers = f"1, {workers[9:]} replicas"
print(f"| {label} | {workers} | {straggler} | {measured:.0f} | {predicted:.0f} | {error:+.1%} | {worst:+.1%} | "
      f"{replay} | {link} | {whys} |")
EOF
}

table() {
  echo "| link | workers | straggler | measured samples/s | predicted | error (medians) | worst round | replayed from its own steps: error | link the doctor used | where the prediction or the replay misses by more than 15%, why |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  local workers slow rate replicas consistency
  local where=${WHERE:-all}
  if [ "$where" = all ] || [ "$where" = mirrored ]; then
    for replicas in 2 4; do case_row "one process (MirroredStrategy)" "mirrored:$replicas" - none; done
  fi
  [ "$where" != mirrored ] || return 0
  if [ "$where" = all ] || [ "$where" = loopback ]; then
    for slow in none worker:1:2x; do
      for workers in 2 3 4; do case_row "one host (shared memory)" "$workers" loopback "$slow"; done
    done
  fi
  [ $namespaces = yes ] && [ "$where" != loopback ] || return 0
  [ "$where" = ps ] || for rate in ${RATES:-20mbit 100mbit 1gbit}; do
    netns_pair_up "$a" "$b" "$addr_a" "$addr_b" "$rate" 400ms "$(burst_of "$rate")" >&2 ||
      { : >"$dir/incomplete"; return 0; }
    for slow in none worker:1:2x; do case_row "tbf $rate, two namespaces" 2 "$rate" "$slow"; done
    netns_pair_down "$a" "$b"
  done
  for rate in ${RATES:-20mbit 100mbit 1gbit}; do
    NETNS_BURST=$(burst_of "$rate") netns_star_up "$hub" "$rate" "${hosts[@]}" >&2 || { : >"$dir/incomplete"; return 0; }
    for consistency in async sync; do
      for slow in none worker:1:2x; do
        case_row "tbf $rate, ps: 2 workers, ps and chief on a switch" "ps:$consistency:1" "$rate" "$slow"
      done
      case_row "tbf $rate, ps: 2 workers, 2 ps and chief on a switch" "ps:$consistency:2" "$rate" none
    done
    netns_star_down "$hub" "${hosts[@]}"
  done
}

table >"$dir/table.md"
complete=yes
[ $namespaces = yes ] && [ ! -e "$dir/incomplete" ] || complete=no
# How many cases land within 15%, and the median miss, over all and over each kind of case.
python3 - "$dir/table.md" >>"$dir/table.md" <<'EOF'
import statistics, sys
rows = [r for r in (line.split(" | ") for line in open(sys.argv[1]) if line.startswith("| ")) if r[5][:1] in ("+", "-")]
def misses(column, keep):
    errors = [abs(float(r[column].rstrip("%"))) for r in rows if keep(r) and r[column][:2].lstrip("+-")[:1].isdigit()]
    if not errors:
        return "none"
    within = sum(e <= 15 for e in errors)
    return f"{within} of {len(errors)} within 15%, median miss {statistics.median(errors):.1f}%"
def line(name, keep):
    if any(keep(r) for r in rows):
        print(f"- {name}: predicted {misses(5, keep)}; replayed {misses(7, keep)}")
print()
line("all cases", lambda r: True)
line("replicas in one process", lambda r: "MirroredStrategy" in r[0])
line("workers on one host", lambda r: "one host" in r[0])
line("all-reduce between namespaces", lambda r: "two namespaces" in r[0])
line("parameter server between namespaces", lambda r: "ps:" in r[0])
EOF
cat "$dir/table.md"
if [ $update_docs = yes ] && [ $complete = no ]; then
  echo "whatif_accuracy.sh: the namespaces' cases did not run (root, and a kernel with veth and tbf, needed);" \
    "docs/profiling.md is left as it was" >&2
  exit 1
elif [ $update_docs = yes ]; then
  python3 - "$here/docs/profiling.md" "$dir/table.md" "$rounds" "$(date -u +%Y-%m-%d)" "${FROM:+$(cat "$FROM/day")}" <<'EOF'
import sys
doc, table, rounds, day, kept = sys.argv[1:]
text = open(doc).read()
begin, end = "<!-- whatif-accuracy:begin -->", "<!-- whatif-accuracy:end -->"
if begin not in text or end not in text:
    sys.exit(f"{doc}: no {begin} ... {end} markers to write the table between")
head, rest = text.split(begin, 1)
_, tail = rest.split(end, 1)
made = f"on {day}" if not kept else f"on the runs of {kept} (kept with KEEP, checked again with FROM on {day})"
body = (f"\n`bench/whatif_accuracy.sh --update-docs` {made}, medians of {rounds} rounds "
        f"(seeds' Fashion-MNIST MLP, 1024 rows per worker or replica per step, one thread per worker, "
        f"a warm-up epoch and 200 measured steps or more (20 at 20 and 100 Mbit/s; epochs of the whole "
        f"batches the training set holds where that is under 100 steps); "
        f"MirroredStrategy's replicas share a thread per core):\n\n"
        + open(table).read() + "\n")
open(doc, "w").write(head + begin + body + end + tail)
EOF
fi
