# Two network namespaces joined by a veth pair, each end rate-limited with tbf: two
# "hosts" on one machine with a link of a chosen rate (these kernels have tbf, not netem).
# Sourced by the tests and benchmarks that need one; needs root.
#
#   . scripts/netns_pair.sh
#   netns_pair_up NS_A NS_B ADDR_A ADDR_B RATE [LATENCY]   (as tc writes them: 20mbit, 1gbit;
#                                                          tbf's queue limit, default 400ms)
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

netns_pair_down() {
  ip netns del "$1" 2>/dev/null || true
  ip netns del "$2" 2>/dev/null || true
}

netns_pair_up() {
  local a=$1 b=$2 addr_a=$3 addr_b=$4 rate=$5 latency=${6:-400ms}
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
    ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "$rate" burst 256kb latency "$latency" 2>/dev/null ||
      { echo "tc cannot rate-limit a veth here (no tbf qdisc)"; return 1; }
  done
}
