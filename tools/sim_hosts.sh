#!/usr/bin/env bash
# tools/sim_hosts.sh: simulated hosts on one machine, for multi-host tests. Each host is a
# network namespace (its own network stack, and its own hostname, so OpenMPI treats it as
# another node: TCP between hosts, shared memory only within one), joined to the others by
# veth pairs on a bridge in the caller's namespace. Needs root and iproute2.
#
#   tools/sim_hosts.sh run HOSTS SLOTS [--wire DELAY_MS RATE_MBIT] -- COMMAND...
#       makes HOSTS hosts of SLOTS slots each, runs COMMAND with these in the environment:
#         SIM_HOSTFILE   an OpenMPI hostfile naming them
#         SIM_MPIRUN     an mpirun that launches into the namespaces and keeps MPI on
#                        the addresses made here (give it -np N PROGRAM ...)
#         SIM_HOSTS      the hosts' names, space-separated
#         SIM_NETNS      their namespaces, space-separated (for `ip netns exec`)
#         SIM_SUBNET     the hosts' subnet (10.213.N.0/24, one no interface here uses)
#         SIM_TAG        this run's tag (kill below finds its hosts by it)
#       and removes everything it made when COMMAND ends, fails or is interrupted. With
#       --wire, MPI's traffic between hosts crosses a slow link instead of the bridge: each
#       packet waits DELAY_MS one way and each host sends at most RATE_MBIT (tools/
#       sim_wire.cpp, in userspace: this kernel has no netem). Exits
#       with COMMAND's status, or 77 (CTest's skip) with one line when namespaces cannot be
#       made here.
#   tools/sim_hosts.sh agent TAG HOST COMMAND...
#       the launcher agent OpenMPI calls instead of ssh (plm_rsh_agent): runs COMMAND in
#       the namespace of run TAG's HOST, under HOST's hostname.
#   tools/sim_hosts.sh kill HOST      (inside a run)
#       kills every process in HOST's namespace (a dead host).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
state_root=/run/retort-sim-hosts

die() {
  echo "sim_hosts: $*" >&2
  exit 1
}

usage_error() {  # bad arguments: one line, exit 2
  echo "error: sim_hosts.sh: $*" >&2
  exit 2
}

# number WHAT VALUE: a plain non-negative decimal number (no unit)
number() {
  [[ "$2" =~ ^[0-9]+([.][0-9]+)?$ ]] ||
    usage_error "$1 '$2' is not a number (a plain number, without a unit)"
}

netns_of() {  # TAG HOST -> the namespace of HOST in run TAG, from the registry the run made
  awk -v h="$2" '$1 == h { print $2; found = 1 } END { exit !found }' \
    "$state_root/$1/hosts" 2>/dev/null || die "run '$1' has no simulated host named '$2'"
}

cmd_agent() {
  local tag="$1" host="$2"
  shift 2
  local ns
  ns="$(netns_of "$tag" "$host")"
  # OpenMPI hands the remote command as words of one shell line, as ssh would run it.
  exec ip netns exec "$ns" unshare --uts sh -c "hostname '$host' && exec sh -c \"\$0\"" "$*"
}

cmd_kill() {
  local ns
  ns="$(netns_of "${SIM_TAG:?kill runs inside a run}" "$1")"
  local pids
  pids="$(ip netns pids "$ns" || true)"
  [[ -z "$pids" ]] || kill -9 $pids 2>/dev/null || true
}

cmd_run() {
  (($# >= 2)) || usage_error "run needs HOSTS SLOTS [--wire DELAY_MS RATE_MBIT] -- COMMAND"
  local hosts="$1" slots="$2"
  shift 2
  [[ "$hosts" =~ ^[1-9][0-9]*$ ]] || usage_error "HOSTS '$hosts' is not a positive whole number"
  [[ "$slots" =~ ^[1-9][0-9]*$ ]] || usage_error "SLOTS '$slots' is not a positive whole number"
  wire_delay="" wire_rate=""
  if [[ "${1:-}" == "--wire" ]]; then
    (($# >= 3)) || usage_error "--wire needs DELAY_MS and RATE_MBIT"
    wire_delay="$2" wire_rate="$3"
    number "--wire DELAY_MS" "$wire_delay"
    number "--wire RATE_MBIT" "$wire_rate"
    [[ "$wire_rate" =~ [1-9] ]] || usage_error "--wire RATE_MBIT '$wire_rate' must be above 0"
    shift 3
  fi
  [[ "${1:-}" == "--" ]] && shift
  (($# > 0)) || usage_error "run HOSTS SLOTS [--wire DELAY_MS RATE_MBIT] -- COMMAND: no COMMAND"
  if [[ $EUID -ne 0 ]] || ! command -v ip >/dev/null; then
    echo "sim_hosts: skipped: simulated hosts need root and iproute2 (ip netns)"
    exit 77
  fi
  # A tag unique to this run names everything it makes, so runs side by side do not meet.
  # Globals, not locals: the exit trap that removes them runs after this function returns.
  tag="rs$$"
  dir="$state_root/$tag"
  mkdir -p "$dir"
  made_bridge="" names=() namespaces=()
  cleanup() {
    set +e
    [[ -z "${wire_pid:-}" ]] || kill "$wire_pid" 2>/dev/null
    for ns in "${namespaces[@]}"; do
      local pids
      pids="$(ip netns pids "$ns" 2>/dev/null)"
      [[ -z "$pids" ]] || kill -9 $pids 2>/dev/null
      [[ ! -f "$state_root/$ns.peer" ]] || ip link del "$(cat "$state_root/$ns.peer")" 2>/dev/null
      ip netns del "$ns" 2>/dev/null
      rm -f "$state_root/$ns.peer"
    done
    [[ -z "$made_bridge" ]] || ip link del "$made_bridge" 2>/dev/null
    rm -rf "$dir"
  }
  trap cleanup EXIT
  trap 'exit 130' INT TERM
  # One run at a time picks a subnet no other interface here uses, and claims it.
  exec 9>"$state_root/lock"
  flock 9
  local octet addresses
  addresses="$(ip -4 addr show)"  # read once (and no grep -q in a pipe under pipefail)
  for octet in $(seq 20 250) none; do
    [[ "$addresses" == *"inet 10.213.$octet."* ]] || break
  done
  [[ "$octet" != none ]] || die "every subnet 10.213.20-250.0/24 is taken"
  subnet="10.213.$octet"
  if ! ip link add "${tag}b" type bridge 2>/dev/null; then
    echo "sim_hosts: skipped: cannot make network devices here (ip link add ... type bridge)"
    exit 77
  fi
  made_bridge="${tag}b"
  ip addr add "$subnet.254/24" dev "$made_bridge"
  flock -u 9
  ip link set "$made_bridge" up
  : >"$dir/hosts"
  : >"$dir/hostfile"
  for ((h = 0; h < hosts; ++h)); do
    local name="host$h" ns="${tag}h$h" peer="${tag}p$h"
    names+=("$name")
    namespaces+=("$ns")
    ip netns add "$ns"
    ip link add eth0 netns "$ns" type veth peer name "$peer"
    echo "$peer" >"$state_root/$ns.peer"
    ip link set "$peer" master "$made_bridge"
    ip link set "$peer" up
    ip netns exec "$ns" ip addr add "$subnet.$((h + 1))/24" dev eth0
    ip netns exec "$ns" ip link set eth0 up
    ip netns exec "$ns" ip link set lo up
    echo "$name $ns" >>"$dir/hosts"
    echo "$name slots=$slots" >>"$dir/hostfile"
  done
  # The slow link: a TUN device in each host on a second subnet, joined by sim_wire, which
  # delays and rate-limits what crosses it; MPI's TCP traffic between hosts goes there.
  local mpi_subnet="$subnet.0/24"
  if [[ -n "$wire_delay" ]]; then
    local wire_bin="${SIM_WIRE:-$here/../${RETORT_BUILD:-build}/tools/sim_wire}"
    [[ -x "$wire_bin" ]] || die "no sim_wire program at $wire_bin (build it, or set SIM_WIRE)"
    local wire_subnet="10.214.${subnet##*.}"
    for ((h = 0; h < hosts; ++h)); do
      ip netns exec "${namespaces[h]}" ip tuntap add dev wire0 mode tun
      ip netns exec "${namespaces[h]}" ip addr add "$wire_subnet.$((h + 1))/24" dev wire0
      ip netns exec "${namespaces[h]}" ip link set wire0 mtu 65000 up
    done
    "$wire_bin" --delay-ms "$wire_delay" --rate-mbit "$wire_rate" "${namespaces[@]}" &
    wire_pid=$!
    mpi_subnet="$wire_subnet.0/24"
  fi
  # The launcher reaches the hosts by name: the agent maps names to namespaces, and OpenMPI
  # needs no resolver for them since every address is given as a subnet below.
  export SIM_HOSTFILE="$dir/hostfile" SIM_HOSTS="${names[*]}" SIM_NETNS="${namespaces[*]}"
  export SIM_SUBNET="$subnet.0/24" SIM_TAG="$tag"
  # mpirun with the options that launch into the namespaces and keep MPI (its launch
  # channel and its TCP transport) on this subnet. No binding: each host's daemon thinks the
  # machine's cores are its own, and would bind every host's first rank to core 0.
  cat >"$dir/mpirun" <<EOF_MPIRUN
#!/bin/sh
exec mpirun --hostfile $SIM_HOSTFILE --mca plm_rsh_agent "$here/sim_hosts.sh agent $tag" \\
  --mca plm_rsh_no_tree_spawn 1 --mca btl self,vader,tcp --mca btl_tcp_if_include $mpi_subnet \\
  --mca oob_tcp_if_include $SIM_SUBNET --bind-to none -x OMP_NUM_THREADS "\$@"
EOF_MPIRUN
  chmod +x "$dir/mpirun"
  export SIM_MPIRUN="$dir/mpirun"
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
  local status=0
  "$@" || status=$?
  return $status
}

case "${1:-}" in
  run) shift && cmd_run "$@" ;;
  agent) shift && cmd_agent "$@" ;;
  kill) shift && cmd_kill "$@" ;;
  *) usage_error "'${1:-}': the first argument is run, agent or kill (see the header)" ;;
esac
