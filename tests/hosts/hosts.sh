#!/usr/bin/env bash
# Several real hosts on one Linux machine, for the multi-host tests (ctest
# label hosts): each host is a network namespace with an address of its own
# on a bridge (a veth pair each) and a UTS namespace with a hostname of its
# own, and CPUs of its own (the machine's divided among the hosts); the file
# system is the machine's, shared by every host as an NFS
# mount would be. mpirun runs on a login node (a network namespace "head"
# with the bridge's address .254; the machine's hostname) and reaches the
# hosts through an rsh agent that enters a host, over TCP only. Every
# namespace gives up on a connection whose data go unacknowledged after
# ~13 s (net.ipv4.tcp_retries2=5, see docs/multi-node.md), so that mpirun
# notices a lost host in bounded time.
#
#   hosts.sh up DIR K [OWNER_PID]  start hosts node1..nodeK; state in DIR (a new
#                                  folder); with OWNER_PID, a reaper tears them
#                                  down when that process ends, however it ends
#   hosts.sh down DIR              stop every process in the hosts, remove the
#                                  namespaces, links, bridge and DIR
#   hosts.sh leftovers ID SUBNET   what `down` left of the hosts whose DIR/id and
#                                  DIR/subnet these were (exit 1 if anything)
#   hosts.sh mpirun DIR ARGS...    mpirun across the hosts (DIR/hostfile: 2 slots
#                                  a host unless VTRAIN_HOSTS_SLOTS said otherwise at
#                                  `up`; VTRAIN_HOSTS_HOSTFILE: another hostfile)
#   hosts.sh exec DIR HOST CMD...  run CMD in HOST (its network and hostname)
#   hosts.sh shape DIR RATE [DELAY [LOSS]]  shape every host's link: RATE
#                                  (tc: 1gbit, 100mbit; "none": unlimited),
#                                  DELAY one way (0.5ms), LOSS of packets (1%)
#   hosts.sh cut DIR HOST          take HOST's link down (a cable pulled)
#   hosts.sh uncut DIR HOST        bring it up again
#   hosts.sh kill DIR HOST NAME    SIGKILL every process called NAME in HOST
#   hosts.sh check                 exit 0 if this machine can make hosts, else
#                                  print why and exit 77
#   hosts.sh rsh DIR HOST CMD      the plm_rsh_agent (DIR/rsh calls it)
#
# Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN), iproute2 and util-linux
# (unshare, nsenter); packet loss without the kernel's sch_netem needs nft
# (nftables), and a one-way delay needs sch_netem.
set -euo pipefail

self=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")

die() { echo "hosts.sh: $*" >&2; exit 1; }

# --- State of one set of hosts (DIR) --------------------------------------
# DIR/id      a short id that names its namespaces and links (vtrain-ID-nodeN,
#             vtbID, vtvIDnN), so that several sets can live side by side
# DIR/subnet  its /24 (10.231.N), the login node .254, host k .k
# DIR/hosts   the host names, one a line
# DIR/cpus-H  the CPUs of host H: the machine's divided among the hosts, so
#             that a host's ranks contend for its cores alone, as on a cluster
load() {
  dir=$1
  [ -f "$dir/id" ] || die "$dir holds no hosts (no $dir/id)"
  id=$(cat "$dir/id")
  subnet=$(cat "$dir/subnet")
  mapfile -t hosts <"$dir/hosts"
}
netns_of() { echo "vtrain-$id-$1"; }
bridge_of() { echo "vtb$id"; }
veth_of() { if [ "$1" = head ]; then echo "vtv${id}n0"; else echo "vtv${id}n${1#node}"; fi; }
uts_of() { echo "$dir/uts-$id-$1"; }

# Becomes the rest, run in host $1 with the caller's environment.
enter() {
  local host=$1
  shift
  exec nsenter --net="/run/netns/$(netns_of "$host")" --uts="$(uts_of "$host")" -- \
    taskset -c "$(cat "$dir/cpus-$host")" "$@"
}

check() {
  local why=""
  if [ "$(id -u)" -ne 0 ]; then
    why="not root (network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN)"
  else
    for tool in ip unshare nsenter tc mpirun; do
      command -v "$tool" >/dev/null || why="${why:+$why; }no $tool on PATH"
    done
    if [ -z "$why" ]; then
      local probe="vtrain-probe-$$"
      if ! err=$(ip netns add "$probe" 2>&1); then
        why="cannot create a network namespace: $err"
      else
        ip netns del "$probe"
        if ! err=$(unshare --uts true 2>&1); then why="cannot create a UTS namespace: $err"; fi
      fi
    fi
  fi
  if [ -n "$why" ]; then
    echo "SKIP: cannot start hosts here: $why"
    exit 77
  fi
}

# The CPUs this process may run on, one a line.
allowed_cpus() {
  local list part
  list=$(awk '/^Cpus_allowed_list:/ {print $2}' /proc/self/status)
  for part in ${list//,/ }; do
    if [[ $part == *-* ]]; then seq "${part%-*}" "${part#*-}"; else echo "$part"; fi
  done
}

# Host i of k (from 0) gets its share of the CPUs, or one shared with others
# where there are fewer CPUs than hosts.
cpus_of_host() {
  local i=$1 k=$2 cpus n
  mapfile -t cpus < <(allowed_cpus)
  n=${#cpus[@]}
  if ((n < k)); then
    echo "${cpus[i % n]}"
  else
    local from=$((i * n / k)) to=$(((i + 1) * n / k)) list=() c
    for ((c = from; c < to; c++)); do list+=("${cpus[c]}"); done
    (IFS=,; echo "${list[*]}")
  fi
}

# The first 10.231.N/24 that no interface of this machine uses.
free_subnet() {
  local used n
  used=$(ip -4 -o addr show | awk '{print $4}')
  for n in $(seq 1 250); do
    grep -q "^10\.231\.$n\." <<<"$used" || { echo "10.231.$n"; return; }
  done
  die "no free subnet 10.231.N.0/24"
}

up() {
  (($# >= 2)) || die "usage: hosts.sh up DIR K [OWNER_PID]"
  dir=$1
  local k=$2 owner=${3:-}
  [[ $k =~ ^[1-9][0-9]?$ ]] || die "K must be 1..99 hosts, not '$k'"
  mkdir -p "$dir"
  [ ! -f "$dir/id" ] || die "$dir already holds hosts"
  id=$(printf '%05x' $(($$ % 0x100000)))
  printf '%s\n' "$id" >"$dir/id"
  : >"$dir/hosts"
  # Whatever fails from here on, take down what was made.
  trap 'down "$dir" >/dev/null 2>&1 || true' ERR
  subnet=$(free_subnet)
  printf '%s\n' "$subnet" >"$dir/subnet"
  local bridge
  bridge=$(bridge_of)
  ip link add "$bridge" type bridge
  ip link set "$bridge" up
  attach head 254
  local i host
  for i in $(seq 1 "$k"); do
    host=node$i
    echo "$host" >>"$dir/hosts"
    attach "$host" "$i"
    # The hostname lives in a UTS namespace kept by a bind mount, not a process.
    : >"$(uts_of "$host")"
    unshare --uts="$(uts_of "$host")" hostname "$host"
    cpus_of_host $((i - 1)) "$k" >"$dir/cpus-$host"
  done
  mapfile -t hosts <"$dir/hosts"
  # What mpirun reads: each host's name, its slots, and the agent entering it.
  for host in "${hosts[@]}"; do echo "$host slots=${VTRAIN_HOSTS_SLOTS:-2}"; done >"$dir/hostfile"
  printf '#!/bin/sh\nexec %q rsh %q "$@"\n' "$self" "$dir" >"$dir/rsh"
  chmod +x "$dir/rsh"
  trap - ERR
  if [ -n "$owner" ]; then
    setsid "$self" reap "$dir" "$owner" </dev/null >/dev/null 2>&1 &
    echo $! >"$dir/reaper.pid"
  fi
}

# Makes namespace `name` with address .`n` on the bridge.
attach() {
  local name=$1 n=$2 ns veth
  ns=$(netns_of "$name")
  veth=$(veth_of "$name")
  ip netns add "$ns"
  ip link add "$veth" type veth peer name eth0 netns "$ns"
  ip link set "$veth" master "$(bridge_of)" up
  ip -n "$ns" addr add "$subnet.$n/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  ip netns exec "$ns" sh -c 'echo 5 >/proc/sys/net/ipv4/tcp_retries2'
}

# Tears the hosts down once `owner` has ended (a test that crashed or was
# killed leaves nothing behind), or quits when they are gone already.
reap() {
  local owner=$2
  dir=$1
  while [ -f "$dir/id" ] && kill -0 "$owner" 2>/dev/null; do sleep 0.5; done
  [ -f "$dir/id" ] && down "$dir" reaper
  exit 0
}

# Kills every process whose network namespace is `ns`, until none is left
# (an orted may start a rank while we kill).
kill_in() {
  local ns=$1 pids tries=0
  while pids=$(ip netns pids "$ns" 2>/dev/null) && [ -n "$pids" ]; do
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    tries=$((tries + 1))
    ((tries < 100)) || { echo "hosts.sh: processes in $ns survive SIGKILL: $pids" >&2; return 1; }
    sleep 0.05
  done
}

down() {
  dir=$1
  local caller=${2:-}
  [ -f "$dir/id" ] || return 0
  load "$dir"
  if [ "$caller" != reaper ] && [ -f "$dir/reaper.pid" ]; then
    kill "$(cat "$dir/reaper.pid")" 2>/dev/null || true
  fi
  local host ns status=0
  for host in head "${hosts[@]}"; do
    ns=$(netns_of "$host")
    if [ -e "/run/netns/$ns" ]; then
      kill_in "$ns" || status=1
      ip netns del "$ns" || status=1   # also removes the veth pair
    fi
    ip link del "$(veth_of "$host")" 2>/dev/null || true
    if mountpoint -q "$(uts_of "$host")" 2>/dev/null; then umount "$(uts_of "$host")" || status=1; fi
  done
  ip link del "$(bridge_of)" 2>/dev/null || true
  ((status == 0)) || die "could not take every host of $dir down"
  rm -rf "$dir"
}

# Prints what is left of the hosts of id $1 on subnet $2: namespaces,
# links, hostname mounts, and processes that name the subnet (Open MPI's
# daemons carry mpirun's address); exit 1 if anything.
leftovers() {
  local id=$1 subnet=$2 left
  left=$(
    ip netns list | awk -v p="vtrain-$id-" 'index($1, p) == 1 {print "namespace " $1}'
    ip -o link show | awk -F': ' -v b="vtb$id" -v v="vtv$id" \
      'index($2, b) == 1 || index($2, v) == 1 {print "link " $2}'
    awk -v p="/uts-$id-" 'index($2, p) {print "mount " $2}' /proc/mounts
    local f line
    for f in /proc/[0-9]*/cmdline; do
      line=$(tr '\0' ' ' <"$f" 2>/dev/null) || continue
      [[ $line == *"$subnet".[0-9]* && $line != *leftovers* ]] && echo "process ${f//[^0-9]/}: $line"
    done
  ) || true
  if [ -n "$left" ]; then
    echo "$left"
    return 1
  fi
}

mpirun_across() {
  load "$1"
  shift
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  # TCP alone, on the hosts' subnet, for MPI messages (btl) and for Open
  # MPI's own wire-up (oob); the daemons are started by the agent, one by
  # one from here (no tree spawn: a host does not enter another).
  exec nsenter --net="/run/netns/$(netns_of head)" -- mpirun --hostfile "${VTRAIN_HOSTS_HOSTFILE:-$dir/hostfile}" \
    --mca plm_rsh_agent "$dir/rsh" --mca plm_rsh_no_tree_spawn 1 \
    --mca btl tcp,self --mca btl_tcp_if_include "$subnet.0/24" \
    --mca oob_tcp_if_include "$subnet.0/24" \
    --mca mpi_yield_when_idle 1 "$@"
}

# The rsh agent: Open MPI calls it as `agent HOST COMMAND...` and expects
# COMMAND to run in HOST's shell, as ssh would.
rsh() {
  load "$1"
  local host=$2
  shift 2
  [ -f "$(uts_of "$host")" ] || die "no host '$host' in $dir (hosts: ${hosts[*]})"
  enter "$host" /bin/sh -c "$*"
}

netem_available() {
  local probe="vtrain-probe-$$" ok=1
  ip netns add "$probe"
  ip -n "$probe" link set lo up
  tc -n "$probe" qdisc add dev lo root netem delay 1ms 2>/dev/null || ok=0
  ip netns del "$probe"
  ((ok))
}

shape() {
  load "$1"
  local rate=$2 delay=${3:-0ms} loss=${4:-0%} host ns
  if netem_available; then
    local args=(delay "$delay" loss "$loss" limit 10000)
    [ "$rate" = none ] || args+=(rate "$rate")
    for host in "${hosts[@]}"; do
      tc -n "$(netns_of "$host")" qdisc replace dev eth0 root netem "${args[@]}"
    done
    return
  fi
  # This kernel has no sch_netem: tbf limits the rate, nftables drops packets
  # at random on arrival; a delay cannot be made.
  [[ $delay =~ ^0+(\.0+)?(ms|us|s)?$ ]] ||
    die "a delay of $delay needs the kernel's sch_netem, which this kernel lacks"
  for host in "${hosts[@]}"; do
    ns=$(netns_of "$host")
    tc -n "$ns" qdisc del dev eth0 root 2>/dev/null || true
    if [ "$rate" != none ]; then
      # A burst of 1 ms at the rate (at least 64 KiB), a queue of 100 ms.
      local bits
      bits=$(tc_rate_bits "$rate")
      local burst=$((bits / 8 / 1000 > 65536 ? bits / 8 / 1000 : 65536))
      tc -n "$ns" qdisc add dev eth0 root tbf rate "$rate" burst "$burst" latency 100ms
    fi
    ip netns exec "$ns" nft delete table netdev vtrain_loss 2>/dev/null || true
    if [ "$loss" != 0% ] && [ "$loss" != 0 ]; then
      command -v nft >/dev/null || die "packet loss needs nft (nftables) or the kernel's sch_netem"
      local per_100k
      per_100k=$(awk -v l="${loss%\%}" 'BEGIN {printf "%d", l * 1000 + 0.5}')
      ip netns exec "$ns" nft -f - <<EOF
table netdev vtrain_loss {
  chain arrive {
    type filter hook ingress device eth0 priority 0;
    numgen random mod 100000 < $per_100k drop
  }
}
EOF
    fi
  done
}

# tc's rate words (kbit, mbit, gbit) in bits per second.
tc_rate_bits() {
  local r=${1,,}
  case $r in
    *gbit) echo $((${r%gbit} * 1000000000)) ;;
    *mbit) echo $((${r%mbit} * 1000000)) ;;
    *kbit) echo $((${r%kbit} * 1000)) ;;
    *bit) echo "${r%bit}" ;;
    *) die "rate '$1': expected a number and kbit, mbit or gbit" ;;
  esac
}

uncut_link() {
  load "$1"
  ip -n "$(netns_of "$2")" link set eth0 up
}

kill_named() {
  load "$1"
  local pid
  for pid in $(ip netns pids "$(netns_of "$2")"); do
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$3" ] && kill -KILL "$pid" 2>/dev/null
  done
  return 0
}

cut_link() {
  load "$1"
  ip -n "$(netns_of "$2")" link set eth0 down
}

command=${1:-}
(($# > 0)) && shift
case $command in
  check) check ;;
  up) up "$@" ;;
  down) (($# == 1)) || die "usage: hosts.sh down DIR"; down "$1" ;;
  reap) reap "$@" ;;
  leftovers) (($# == 2)) || die "usage: hosts.sh leftovers ID SUBNET"; leftovers "$@" ;;
  mpirun) mpirun_across "$@" ;;
  exec) load "$1"; host=$2; shift 2; enter "$host" "$@" ;;
  rsh) rsh "$@" ;;
  shape) (($# >= 2)) || die "usage: hosts.sh shape DIR RATE [DELAY [LOSS]]"; shape "$@" ;;
  cut) (($# == 2)) || die "usage: hosts.sh cut DIR HOST"; cut_link "$@" ;;
  uncut) (($# == 2)) || die "usage: hosts.sh uncut DIR HOST"; uncut_link "$@" ;;
  kill) (($# == 3)) || die "usage: hosts.sh kill DIR HOST NAME"; kill_named "$@" ;;
  *) sed -n '2,34p' "$self"; exit 2 ;;
esac
