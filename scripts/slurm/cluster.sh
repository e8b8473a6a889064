#!/usr/bin/env bash
# A real Slurm on this machine for the tests, from Debian's packages (slurmctld, slurmd,
# slurm-client, munge; scripts/install-deps.sh installs them): one controller and two nodes, node1
# and node2, each its own slurmd on this host (slurmd -N; ports 17101/17102), so a job can span
# "two nodes" (SLURM_NODEID 0 and 1, SLURM_JOB_NODELIST=node[1-2]). The node names do not resolve:
# multi-node jobs here set MASTER_ADDR=127.0.0.1. No systemd: the daemons are started here, their
# pids recorded, and `stop` kills exactly those.
#   eval "$(scripts/slurm/cluster.sh start)"   # prints `export SLURM_CONF=...`
#   scripts/slurm/cluster.sh stop
#   scripts/slurm/cluster.sh lose node1 / revive node1   # a node lost without notice, and back
# MLTRAIN_SLURM_CPUS=N: N CPUs per node whatever the host has.
# State lives in $MLTRAIN_SLURM_DIR (default /tmp/mltrain-slurm). Settings that make requeue fast:
# cred_expire=10 (a requeued job otherwise waits 120 s) and a 2 s scheduler interval.
set -euo pipefail
D=${MLTRAIN_SLURM_DIR:-/tmp/mltrain-slurm}
cmd=${1:-status}
need_root() { [ "$(id -u)" -eq 0 ] || { echo "cluster.sh: needs root (munged and slurmd)" >&2; exit 2; }; }

NODES="node1 node2"
stop() {
  for p in slurmd-node1 slurmd-node2 slurmd slurmctld munged; do  # slurmd: the one-node layout of earlier versions
    if [ -f "$D/$p.pid" ]; then
      pid=$(cat "$D/$p.pid")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
      rm -f "$D/$p.pid"
    fi
  done
}

case "$cmd" in
start)
  need_root
  for b in slurmctld slurmd munged sbatch; do
    command -v $b >/dev/null || { echo "cluster.sh: $b missing; run scripts/install-deps.sh" >&2; exit 2; }
  done
  stop
  rm -rf "$D/state" "$D/spool"  # a fresh cluster: no jobs or nodes remembered from an earlier start
  mkdir -p "$D"/{state,spool,log}
  host=$(hostname -s)
  # munge: a private key and socket, owned by the munge user (munged refuses loose permissions).
  mkdir -p "$D/munge"
  [ -f "$D/munge/munge.key" ] || dd if=/dev/urandom of="$D/munge/munge.key" bs=1024 count=1 status=none
  chown -R munge:munge "$D/munge"
  chmod 700 "$D/munge"
  chmod 400 "$D/munge/munge.key"
  runuser -u munge -- munged --key-file="$D/munge/munge.key" --socket="$D/munge/munge.sock" \
    --pid-file="$D/munge/munged.pid" --log-file="$D/munge/munged.log" --seed-file="$D/munge/munged.seed" --force
  for _ in $(seq 50); do [ -f "$D/munge/munged.pid" ] && break; sleep 0.1; done
  cp "$D/munge/munged.pid" "$D/munged.pid"
  # MLTRAIN_SLURM_CPUS declares more CPUs per node than the host has (config_overrides), for
  # many cheap tasks at once (scripts/bench/tune/journal_chaos.py: 32 drivers on two "nodes").
  cpus=${MLTRAIN_SLURM_CPUS:-$(nproc)}
  mem=$(slurmd -C 2>/dev/null | grep -o 'RealMemory=[0-9]*' | cut -d= -f2 || echo 1000)
  cat >"$D/slurm.conf" <<CONF
ClusterName=mltrain
SlurmctldHost=$host
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$D/munge/munge.sock,cred_expire=10
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
$([ -n "${MLTRAIN_SLURM_CPUS:-}" ] && echo SlurmdParameters=config_overrides)
SchedulerParameters=batch_sched_delay=0,sched_interval=2,bf_interval=1
JobAcctGatherType=jobacct_gather/none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
KillWait=10
MinJobAge=300
NodeName=node1 NodeHostname=$host NodeAddr=127.0.0.1 Port=17101 CPUs=$cpus RealMemory=$((mem / 2)) State=UNKNOWN
NodeName=node2 NodeHostname=$host NodeAddr=127.0.0.1 Port=17102 CPUs=$cpus RealMemory=$((mem / 2)) State=UNKNOWN
# Preemption (tests/cli/test_cli_preempt.cpp): a job in \`urgent\` requeues the jobs it needs the
# CPUs of in \`grace\` (SIGTERM, SIGKILL 15 s later) or \`nograce\` (no notice), as a site's
# preemptible partitions do. \`debug\` jobs are never preempted.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
PartitionName=debug Nodes=node[1-2] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES PriorityTier=5 PreemptMode=OFF
PartitionName=grace Nodes=node[1-2] MaxTime=INFINITE State=UP OverSubscribe=NO PriorityTier=1 GraceTime=15
PartitionName=nograce Nodes=node[1-2] MaxTime=INFINITE State=UP OverSubscribe=NO PriorityTier=1 GraceTime=0
PartitionName=urgent Nodes=node[1-2] MaxTime=INFINITE State=UP OverSubscribe=NO PriorityTier=10 PreemptMode=OFF
CONF
  export SLURM_CONF="$D/slurm.conf"
  slurmctld -f "$SLURM_CONF"
  for n in $NODES; do
    mkdir -p "$D/spool/$n"
    slurmd -f "$SLURM_CONF" -N "$n"
  done
  # Every node up: sinfo prints one state per node line (-N), none of them unknown or down.
  up() { [ "$(sinfo -h -N -p debug -o %T 2>/dev/null | grep -cE '^(idle|mixed|allocated)')" -eq 2 ]; }
  for _ in $(seq 100); do up && break; sleep 0.2; done
  scontrol update nodename=node[1-2] state=resume >/dev/null 2>&1 || true
  for _ in $(seq 25); do up && break; sleep 0.2; done
  up || { echo "cluster.sh: nodes not idle; see $D/log" >&2; sinfo -N >&2; exit 1; }
  echo "export SLURM_CONF=$D/slurm.conf"
  ;;
stop) stop ;;
lose)
  # A node lost without notice (power, kernel panic): SIGKILL to its slurmd and to every process of
  # the jobs on it, then marked down, as slurmctld does once the node stops answering. Jobs with
  # --requeue go back to the queue. `revive` brings the node back.
  n=${2:?usage: cluster.sh lose NODE}
  export SLURM_CONF="$D/slurm.conf"
  tree() { echo "$1"; for c in $(pgrep -P "$1"); do tree "$c"; done; }
  pids=$(cat "$D/slurmd-$n.pid")
  for j in $(squeue -h -w "$n" -t running -o %A); do
    for s in $(pgrep -f "slurmstepd: \\[$j\\."); do pids="$pids $(tree "$s")"; done
  done
  kill -9 $pids 2>/dev/null || true
  rm -f "$D/slurmd-$n.pid"
  scontrol update nodename="$n" state=down reason="lost (cluster.sh lose)"
  ;;
revive)
  n=${2:?usage: cluster.sh revive NODE}
  export SLURM_CONF="$D/slurm.conf"
  slurmd -f "$SLURM_CONF" -N "$n"
  for _ in $(seq 50); do scontrol update nodename="$n" state=resume 2>/dev/null && break; sleep 0.2; done
  ;;
status)
  [ -f "$D/slurm.conf" ] && SLURM_CONF="$D/slurm.conf" sinfo || echo "not running"
  ;;
*) echo "usage: $0 start|stop|status|lose NODE|revive NODE" >&2; exit 2 ;;
esac
