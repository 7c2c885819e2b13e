# Shared by test/slurm/up.sh, down.sh, node.sh, shell.sh. Sourced, not run;
# needs $here (test/slurm).

# slurm_vars: the cluster's names and places, from the environment.
slurm_vars() {
  root=$(cd "$here/../.." && pwd)
  STATE=${GORUN_SLURM_STATE:-$here/run}
  export HOSTS=${HOSTS:-2}
  CTLD_PORT=${GORUN_SLURM_PORT:-6817}
  # A set of test hosts of Slurm's own (test/hosts/up.sh's variables).
  export GORUN_HOSTS_NAME=${GORUN_HOSTS_NAME:-gorun-s}
  export GORUN_HOSTS_VETH=${GORUN_HOSTS_VETH:-gr-s}
  export GORUN_HOSTS_BRIDGE=${GORUN_HOSTS_BRIDGE:-gorunbrs}
  export GORUN_HOSTS_NET=${GORUN_HOSTS_NET:-198.18.78}
  export GORUN_HOSTS_STATE=${GORUN_HOSTS_STATE:-$STATE/hosts}
  NAME=$GORUN_HOSTS_NAME NET=$GORUN_HOSTS_NET
  read -r -a CPU_LIST <<< "${CPUS:-}"
  export SLURM_CONF=$STATE/slurm.conf
}

# node_cpus i: the CPUs node i declares: those of its CPUS list, else all.
node_cpus() {
  if [ ${#CPU_LIST[@]} -gt 0 ]; then
    taskset -c "${CPU_LIST[$(($1 - 1))]}" nproc
  else
    nproc
  fi
}

# start_munged DIR KEY: a munged with its socket, pid, log and seed in DIR.
start_munged() {
  local dir=$1 key=$2
  mkdir -p "$dir"
  munged --socket="$dir/munge.socket" --key-file="$key" --pid-file="$dir/munged.pid" \
    --log-file="$dir/munged.log" --seed-file="$dir/munged.seed" --force 2>>"$dir/munged.out" || {
    echo "test/slurm: munged for $dir did not start: $(tail -n 1 "$dir/munged.log" 2>/dev/null)" >&2; return 1; }
  for try in $(seq 1 50); do
    [ -S "$dir/munge.socket" ] && return 0
    sleep 0.1
  done
  echo "test/slurm: munged for $dir made no socket; see $dir/munged.log" >&2
  return 1
}

# write_conf ctl|I: slurm.conf for the controller (and the commands) or
# for node I (its own munge socket, pid file, spool and log).
write_conf() {
  local sock=$STATE/munge/munge.socket nd=$STATE/ctld
  if [ "$1" != ctl ]; then nd=$STATE/h$1; sock=$nd/munge.socket; fi
  cat <<CONF
# Made by test/slurm/up.sh for this run.
ClusterName=gorun
SlurmctldHost=$(hostname -s)($NET.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$sock,cred_expire=20
CredType=cred/munge
StateSaveLocation=$STATE/ctld
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdPidFile=$nd/slurmd.pid
SlurmdSpoolDir=$nd/spool
SlurmdLogFile=$nd/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$STATE/jobcomp.log
ReturnToService=2
SlurmdTimeout=30
SlurmctldTimeout=30
MessageTimeout=10
KillWait=15
InactiveLimit=0
SchedulerParameters=bf_interval=5
MinJobAge=600
MailProg=/bin/true
PropagateResourceLimits=NONE
DebugFlags=NO_CONF_HASH
SlurmdParameters=config_overrides
SlurmctldDebug=info
SlurmdDebug=info
CONF
  local i
  for i in $(seq 1 "$HOSTS"); do
    echo "NodeName=h$i NodeAddr=$NET.$((10 + i)) NodeHostname=h$i CPUs=$(node_cpus "$i") State=UNKNOWN"
  done
  echo "PartitionName=gorun Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
}

# start_node I KEY: node I's munged (with KEY) and slurmd, inside its
# network namespace, with a host name (hI) and an /etc/hosts (the names of
# the cluster) of its own: a UTS and a mount namespace of slurmd's, which
# its jobs inherit. nsenter rather than `ip netns exec`, which would mount a
# sysfs of the namespace's own over /sys, hiding the cgroup mounts slurmd
# reads at start.
start_node() {
  local i=$1 key=$2 d=$STATE/h$1 ns=$NAME$1
  mkdir -p "$d/spool"
  install -m 400 "$key" "$d/munge.key"
  start_munged "$d" "$d/munge.key" || return 1
  write_conf "$i" > "$d/slurm.conf"
  printf 'CgroupPlugin=autodetect\nIgnoreSystemd=yes\n' > "$d/cgroup.conf"
  { echo "127.0.0.1 localhost"; echo "$NET.1 $(hostname -s)"
    local j; for j in $(seq 1 "$HOSTS"); do echo "$NET.$((10 + j)) h$j"; done; } > "$d/hosts"
  local pin=()
  [ ${#CPU_LIST[@]} -gt 0 ] && pin=(taskset -c "${CPU_LIST[$((i - 1))]}")
  setsid nsenter --net="/run/netns/$ns" "${pin[@]}" unshare --mount --uts --propagation private \
    sh -c 'mount --bind "$2" /etc/hosts && hostname "$0" && exec slurmd -D -N "$0" -f "$1"' \
    "h$i" "$d/slurm.conf" "$d/hosts" >>"$d/slurmd.out" 2>&1 </dev/null &
  echo $! > "$d/slurmd.launch.pid"
  disown   # down.sh ends it; no job-control line from bash when it does
}

# wait_node I SECONDS: waits until node I is up in slurmctld; else says in
# one line why not, naming the node, and returns 1.
wait_node() {
  local i=$1 d=$STATE/h$1 ip=$NET.$((10 + $1)) state try
  for try in $(seq 1 $(($2 * 5))); do
    state=$(scontrol -o show node "h$i" 2>/dev/null | sed -n 's/.* State=\([^ ]*\).*/\1/p')
    case "$state" in IDLE* | MIXED* | ALLOCATED*) return 0;; esac
    if ! kill -0 "$(cat "$d/slurmd.launch.pid")" 2>/dev/null; then
      echo "test/slurm: node h$i: slurmd exited: $(grep -h -i -E 'error|fatal' "$d/slurmd.log" "$d/slurmd.out" 2>/dev/null | tail -n 1)" >&2
      return 1
    fi
    if grep -q -E "\[$ip\]:[0-9]+\].*(auth|credential)" "$STATE/slurmctld.log" 2>/dev/null || [ "$try" = $(($2 * 5)) ]; then
      node_diagnosis "$i" "$state"
      return 1
    fi
    sleep 0.2
  done
}

# node_diagnosis I STATE: one line on why node I is not up.
node_diagnosis() {
  local i=$1 d=$STATE/h$1 ip=$NET.$((10 + $1)) out
  if ! out=$(munge -S "$d/munge.socket" -n 2>&1 | unmunge -S "$STATE/munge/munge.socket" 2>&1 >/dev/null); then
    echo "test/slurm: node h$i ($ip) is refused by slurmctld: its munge key differs from the controller's (a credential of its munged fails to decode on the controller's: ${out#unmunge: Error: })" >&2
    return
  fi
  echo "test/slurm: node h$i ($ip) did not come up (state ${2:-unknown}): $(grep -h -i -E 'error|fatal' "$d/slurmd.log" 2>/dev/null | tail -n 1); see $d/slurmd.log" >&2
}
