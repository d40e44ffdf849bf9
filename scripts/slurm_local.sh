#!/usr/bin/env bash
# A real single-node SLURM cluster on this machine, for amp_bench's executor tests and for trying
# `run --executor slurm` without a cluster: Debian's slurm-wlm and munge, one node (this host, all its
# cores) in two partitions, gpu-a and gpu-b, that stand in for two GPU types (the partition is part of
# a machine's label in amp_bench's report).
#
#   scripts/slurm_local.sh start    install (apt, once) and start munged, slurmctld, slurmd; wait until
#                                   `sinfo` shows the node idle
#   scripts/slurm_local.sh stop     stop the daemons (the packages and the config stay)
#   scripts/slurm_local.sh status   is it up? (exit 0 yes, 1 no)
#
# Needs root (apt, /etc/slurm, daemons). The settings are the ones that work in a container: munge
# auth, proctrack/linuxproc, task/none, cons_tres by core, no accounting (sacct then fails: amp_bench
# reads job states with squeue and scontrol, and sacct where a cluster has accounting).
set -euo pipefail

PARTITIONS=${AMP_BENCH_SLURM_PARTITIONS:-gpu-a gpu-b}
CONF_DIR=/etc/slurm
LOG_DIR=/var/log/slurm

up() { timeout 5 sinfo -h -o '%t' 2>/dev/null | grep -qE '^(idle|mix|alloc)'; }

install() {
  if command -v slurmctld >/dev/null && command -v munged >/dev/null; then return; fi
  echo "installing slurm-wlm and munge (Debian packages)"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge) >/dev/null
}

configure() {
  local host cpus
  host=$(hostname -s)
  cpus=$(nproc)
  mkdir -p "$CONF_DIR" "$LOG_DIR" /var/spool/slurmctld /var/spool/slurmd /run/munge /var/lib/munge /var/log/munge
  {
    echo "# written by amp_bench scripts/slurm_local.sh: one node, partitions: $PARTITIONS"
    echo "ClusterName=amp-bench-local"
    echo "SlurmctldHost=$host"
    echo "AuthType=auth/munge"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core"
    echo "SlurmUser=root"
    echo "AccountingStorageType=accounting_storage/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "StateSaveLocation=/var/spool/slurmctld"
    echo "SlurmdSpoolDir=/var/spool/slurmd"
    echo "SlurmctldLogFile=$LOG_DIR/slurmctld.log"
    echo "SlurmdLogFile=$LOG_DIR/slurmd.log"
    echo "SlurmctldPidFile=/run/slurmctld.pid"
    echo "SlurmdPidFile=/run/slurmd.pid"
    echo "ReturnToService=2"
    # a cancelled job gets SIGTERM, then SIGKILL 10 s later: time to write its rows
    echo "KillWait=10"
    # ended jobs stay visible to squeue/scontrol this long (there is no accounting to ask afterwards)
    echo "MinJobAge=600"
    echo "NodeName=$host CPUs=$cpus State=UNKNOWN"
    local first=YES
    for p in $PARTITIONS; do
      echo "PartitionName=$p Nodes=$host Default=$first MaxTime=INFINITE State=UP"
      first=NO
    done
  } > "$CONF_DIR/slurm.conf"
  if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
  chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge
  chmod 400 /etc/munge/munge.key
  chmod 700 /etc/munge
}

start() {
  if up; then echo "slurm is already up: $(sinfo -h -o '%P %t' | tr '\n' ' ')"; return 0; fi
  local t0=$SECONDS
  install
  configure
  pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged
  pgrep -x slurmctld >/dev/null || slurmctld
  pgrep -x slurmd >/dev/null || slurmd
  for _ in $(seq 1 60); do
    if up; then
      echo "slurm is up after $((SECONDS - t0)) s: $(sinfo -h -o '%P %t %c' | tr '\n' ' ')"
      return 0
    fi
    # a node that was down (an earlier stop) comes back when told
    scontrol update nodename="$(hostname -s)" state=resume >/dev/null 2>&1 || true
    sleep 1
  done
  echo "slurm did not come up in 60 s; see $LOG_DIR/slurmctld.log and $LOG_DIR/slurmd.log" >&2
  return 1
}

stop() {
  scancel --user="$(id -un)" >/dev/null 2>&1 || true
  for d in slurmd slurmctld munged; do pkill -x "$d" >/dev/null 2>&1 || true; done
  echo "slurm stopped"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) if up; then sinfo; exit 0; else echo "slurm is not running"; exit 1; fi ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
