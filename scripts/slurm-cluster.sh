#!/usr/bin/env bash
# A Slurm test cluster on this machine, for the Slurm back end's tests: munged, then
# slurmctld and one slurmd per node, all as root, with every path (config, state, spool, logs,
# pids, the munge socket) under one scratch folder. Nothing outside that folder is written, and
# the daemons are stopped by the pids this script recorded, never by name.
# One node is this host, by its name. N > 1 nodes are n1..nN, each a slurmd of its own
# (`slurmd -N nK`: its own port, spool and log) at 127.0.0.1, all in the one partition.
#
# Usage: slurm-cluster.sh start DIR   start (or find running) a cluster under DIR; prints the
#                                     line `SLURM_CONF=DIR/slurm.conf` to export
#        slurm-cluster.sh stop DIR    stop the daemons started under DIR (by their pids)
#        slurm-cluster.sh status DIR  exit 0 when the cluster under DIR answers
# Needs: root, and Debian's slurm-wlm and munge (scripts/setup-system.sh installs them).
# Env: REPROBOX_SLURM_NODES (default 1), REPROBOX_SLURM_CPUS (per node, default 2),
#      REPROBOX_SLURM_PORT (slurmctld; node K's slurmd uses +K; default 6917), REPROBOX_MUNGE_KEY (default /etc/munge/munge.key, the package's).
set -euo pipefail

die() { echo "slurm-cluster: $*" >&2; exit 2; }
[[ $# -eq 2 ]] || die "usage: slurm-cluster.sh start|stop|status DIR"
action=$1
mkdir -p "$2"
dir=$(cd "$2" && pwd)
conf=$dir/slurm.conf
pids=$dir/pids
export SLURM_CONF=$conf

answers() { scontrol ping 2>/dev/null | grep -q "is UP"; }

stop() {
  [[ -f $pids ]] || return 0
  # Reverse order: slurmd, slurmctld, then munged (they authenticate through it).
  local line name pid left=()
  mapfile -t lines < <(tac "$pids")
  for line in "${lines[@]}"; do
    read -r name pid <<<"$line"
    [[ $pid =~ ^[0-9]+$ ]] || continue
    # Only a process that is still the daemon we started (its command line names DIR).
    if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$dir"; then
      kill -TERM "$pid" 2>/dev/null || true
      left+=("$pid")
    fi
  done
  local deadline=$((SECONDS + 15)) pid
  for pid in "${left[@]}"; do
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  rm -f "$pids"
}

case $action in
  stop) stop; exit 0 ;;
  status) answers && sinfo -h -o "%P %t %D" ; exit $? ;;
  start) ;;
  *) die "unknown action: $action (start, stop or status)" ;;
esac

[[ $(id -u) == 0 ]] || die "needs root (the daemons run as root; SlurmUser=root)"
for tool in munged slurmctld slurmd sbatch scontrol; do
  command -v "$tool" >/dev/null || die "$tool is missing; install: apt-get install -y slurm-wlm munge"
done
if [[ -f $pids ]] && answers; then
  echo "SLURM_CONF=$conf"
  exit 0
fi
stop # leftovers of an earlier start under DIR

host=$(hostname -s)
nodes=${REPROBOX_SLURM_NODES:-1}
[[ $nodes =~ ^[1-9][0-9]?$ ]] || die "REPROBOX_SLURM_NODES=$nodes: a node count from 1 to 99"
cpus=${REPROBOX_SLURM_CPUS:-2}
port=${REPROBOX_SLURM_PORT:-6917}
key=${REPROBOX_MUNGE_KEY:-/etc/munge/munge.key}
[[ -r $key ]] || die "no munge key at $key (the munge package creates one)"
# Ask for no more memory than the machine has, or slurmd drains the node ("Low RealMemory").
mem_mb=$(awk '/^MemTotal:/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)
((mem_mb > 20000)) && mem_mb=20000
mkdir -p "$dir"/{state,spool,munge,log}
if ((nodes == 1)); then
  names=("$host")
  node_lines="NodeName=$host CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN"
  spool=$dir/spool
  slurmd_files="SlurmdPidFile=$dir/slurmd.pid
SlurmdLogFile=$dir/log/slurmd.log"
else
  names=() node_lines=""
  for ((k = 1; k <= nodes; k++)); do
    names+=("n$k")
    mkdir -p "$dir/spool/n$k"
    node_lines+="NodeName=n$k NodeHostname=$host NodeAddr=127.0.0.1 Port=$((port + k)) "
    node_lines+="CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN"$'\n'
  done
  node_lines=${node_lines%$'\n'}
  spool=$dir/spool/%n # %n: each slurmd's own node name
  slurmd_files="SlurmdPidFile=$dir/slurmd-%n.pid
SlurmdLogFile=$dir/log/slurmd-%n.log"
fi
node_list=$(IFS=,; echo "${names[*]}")
chmod 0700 "$dir/munge"

cat >"$conf" <<EOF
# Written by scripts/slurm-cluster.sh: a $nodes-node test cluster, accounting off.
ClusterName=reprobox
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# Start a batch job at once rather than up to 3 s later (the default batch_sched_delay).
SchedulerParameters=batch_sched_delay=0
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
KillWait=5
MinJobAge=300
InactiveLimit=0
StateSaveLocation=$dir/state
SlurmdSpoolDir=$spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmctldLogFile=$dir/log/slurmctld.log
$slurmd_files
$node_lines
PartitionName=debug Nodes=$node_list Default=YES MaxTime=INFINITE State=UP
EOF

: >"$pids"
start_daemon() { # name, then the foreground command; its pid goes into DIR/pids
  local name=$1
  shift
  setsid "$@" >"$dir/log/$name.out" 2>&1 </dev/null &
  echo "$name $!" >>"$pids"
}
start_daemon munged munged --foreground --force --socket="$dir/munge/munge.socket" \
  --key-file="$key" --pid-file="$dir/munge/munged.pid" --seed-file="$dir/munge/munged.seed" \
  --log-file="$dir/log/munged.log"
for _ in $(seq 50); do [[ -S $dir/munge/munge.socket ]] && break; sleep 0.1; done
[[ -S $dir/munge/munge.socket ]] || { stop; die "munged did not start (see $dir/log/munged.log)"; }
start_daemon slurmctld slurmctld -D -i -f "$conf"
if ((nodes == 1)); then
  start_daemon slurmd slurmd -D -f "$conf"
else
  for name in "${names[@]}"; do start_daemon "slurmd-$name" slurmd -D -N "$name" -f "$conf"; done
fi

deadline=$((SECONDS + 30))
# Every node up (sinfo: one line per state, with its node count).
up() { sinfo -h -N -o "%N %t" 2>/dev/null | grep -cE " (idle|mix|alloc)$"; }
until answers && (($(up) == nodes)); do
  if ((SECONDS > deadline)); then
    stop
    die "the cluster did not come up in 30 s (see $dir/log/)"
  fi
  sleep 0.2
done
echo "SLURM_CONF=$conf"
