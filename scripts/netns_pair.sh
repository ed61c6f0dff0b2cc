# Two network namespaces joined by a veth pair, each end rate-limited with tbf: two
# "hosts" on one machine with a link of a chosen rate (these kernels have tbf, not netem).
# Sourced by the tests and benchmarks that need one; needs root.
#
#   . scripts/netns_pair.sh
#   netns_pair_up NS_A NS_B ADDR_A ADDR_B RATE [LATENCY [BURST]]   (as tc writes them: 20mbit,
#                      1gbit; tbf's queue limit, default 400ms; its bucket, default 256kb: what
#                      goes at the veth's own speed after the link was idle)
#   ip netns exec NS_A ...
#   netns_pair_down NS_A NS_B
# The addresses (link-local, 169.254.x.y) exist only inside the namespaces. netns_pair_up
# returns non-zero, saying which step failed, where the machine does not allow it.

# For the benchmarks: exits saying why unless PROGRAM is built and this runs as root.
netns_bench_ready() {
  local who=$1 program=$2
  [ -x "$program" ] || { echo "$who: build first (make build): $program is missing" >&2; exit 1; }
  [ "$(id -u)" = 0 ] || { echo "$who: needs root to create network namespaces" >&2; exit 1; }
}

# For a script that runs processes on one pair: sets a and b (the namespaces' names, PREFIX_a
# and PREFIX_b with the script's pid), dir (a new temporary folder) and pids (processes the
# script starts), and on exit kills those, removes the pair and the folder.
#
#   netns_pair_session PREFIX
netns_pair_session() {
  a=${1}_a_$$ b=${1}_b_$$
  dir=$(mktemp -d)
  pids=()
  trap netns_pair_session_end EXIT
}

netns_pair_session_end() {
  [ ${#pids[@]} = 0 ] || kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  netns_pair_down "$a" "$b"
  rm -rf "$dir"
}

netns_pair_down() {
  ip netns del "$1" 2>/dev/null || true
  ip netns del "$2" 2>/dev/null || true
}

netns_pair_up() {
  local a=$1 b=$2 addr_a=$3 addr_b=$4 rate=$5 latency=${6:-400ms} burst=${7:-256kb}
  # Device names are at most 15 bytes: named after a checksum of the namespace's name.
  local va="v$(cksum <<<"$a" | cut -d' ' -f1)" vb="v$(cksum <<<"$b" | cut -d' ' -f1)"
  netns_pair_down "$a" "$b"
  ip netns add "$a" 2>/dev/null || { echo "cannot create network namespaces here (ip netns add failed)"; return 1; }
  ip netns add "$b" || { echo "ip netns add $b failed"; return 1; }
  ip link add "$va" netns "$a" type veth peer name "$vb" netns "$b" 2>/dev/null ||
    { echo "cannot create a veth pair here"; return 1; }
  local side ns dev addr
  for side in "$a:$va:$addr_a" "$b:$vb:$addr_b"; do
    IFS=: read -r ns dev addr <<<"$side"
    ip -n "$ns" link set lo up || { echo "cannot bring up lo in $ns"; return 1; }
    ip -n "$ns" addr add "$addr/30" dev "$dev" || { echo "cannot give $dev the address $addr"; return 1; }
    ip -n "$ns" link set "$dev" up || { echo "cannot bring up $dev in $ns"; return 1; }
    # Each direction is limited on its sender's side.
    ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "$rate" burst "$burst" latency "$latency" 2>/dev/null ||
      { echo "tc cannot rate-limit a veth here (no tbf qdisc)"; return 1; }
  done
}

# A star of "hosts": namespace HUB holds a bridge, and each namespace NS_i is joined to it
# by a veth pair rate-limited at RATE on both ends, so that each host has its own link of
# that rate in each direction (a switch with RATE ports). NS_i gets 169.254.78.(i+1)/24.
#
#   netns_star_up HUB RATE NS_0 NS_1 ...      (NETNS_BURST: tbf's bucket, default 256kb)
#   netns_star_down HUB NS_0 NS_1 ...
netns_star_down() {
  local ns
  for ns in "$@"; do ip netns del "$ns" 2>/dev/null || true; done
}

netns_star_up() {
  local hub=$1 rate=$2
  shift 2
  netns_star_down "$hub" "$@"
  ip netns add "$hub" 2>/dev/null || { echo "cannot create network namespaces here (ip netns add failed)"; return 1; }
  ip -n "$hub" link add br0 type bridge || { echo "cannot create a bridge in $hub"; return 1; }
  ip -n "$hub" link set br0 up
  local i=0 ns host port
  for ns in "$@"; do
    host="h$(cksum <<<"$ns" | cut -d' ' -f1)" port="p$(cksum <<<"$ns" | cut -d' ' -f1)"
    ip netns add "$ns" || { echo "ip netns add $ns failed"; return 1; }
    ip link add "$host" netns "$ns" type veth peer name "$port" netns "$hub" 2>/dev/null ||
      { echo "cannot create a veth pair here"; return 1; }
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "169.254.78.$((i + 1))/24" dev "$host" || { echo "cannot address $host in $ns"; return 1; }
    ip -n "$ns" link set "$host" up
    ip -n "$hub" link set "$port" master br0 || { echo "cannot attach $port to the bridge"; return 1; }
    ip -n "$hub" link set "$port" up
    # Uplink limited on the host's end, downlink on the switch's.
    ip netns exec "$ns" tc qdisc add dev "$host" root tbf rate "$rate" burst "${NETNS_BURST:-256kb}" latency 400ms \
      2>/dev/null &&
      ip netns exec "$hub" tc qdisc add dev "$port" root tbf rate "$rate" burst "${NETNS_BURST:-256kb}" latency 400ms \
        2>/dev/null ||
      { echo "tc cannot rate-limit a veth here (no tbf qdisc)"; return 1; }
    i=$((i + 1))
  done
}
