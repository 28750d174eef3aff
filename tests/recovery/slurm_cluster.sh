#!/usr/bin/env bash
# A throwaway Slurm cluster on this one host, for the recovery backend's tests.
#
#   slurm_cluster.sh start DIR [NODES]   munged + slurmctld + one slurmd per node (default 3), state in DIR;
#                                        prints "export SLURM_CONF=DIR/slurm.conf" on success
#   slurm_cluster.sh stop DIR            stops what start started (by the pid files in DIR only)
#
# Every node is this host (NodeHostname=localhost, its own Port and spool); processes are tracked by
# proctrack/linuxproc and tasks are not confined (task/none), so no cgroups or systemd are needed.
# Needs Debian's slurmctld, slurmd, slurm-client and munge (apt-get install -y slurm-wlm munge).
set -euo pipefail

cmd=${1:?usage: slurm_cluster.sh start|stop DIR [NODES]}
dir=${2:?usage: slurm_cluster.sh start|stop DIR [NODES]}
nodes=${3:-3}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

stop() {
    # TERM every daemon this directory started at once, then KILL what is left after 5 s
    local pids=() pidfile pid
    for pidfile in "$dir"/slurmd-*.pid "$dir"/slurmctld.pid "$dir"/munged.pid; do
        [[ -f $pidfile ]] || continue
        pid=$(cat "$pidfile" 2>/dev/null || true)
        [[ -n $pid ]] && kill "$pid" 2>/dev/null && pids+=("$pid")
        rm -f "$pidfile"
    done
    for _ in $(seq 50); do
        local alive=0
        for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [[ $alive == 0 ]] && return 0
        sleep 0.1
    done
    for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
}

if [[ $cmd == stop ]]; then
    stop
    exit 0
fi
[[ $cmd == start ]] || { echo "unknown command $cmd (start|stop)" >&2; exit 2; }
for bin in munged slurmctld slurmd scontrol sbatch; do
    command -v "$bin" >/dev/null || { echo "missing $bin: apt-get install -y slurm-wlm munge" >&2; exit 3; }
done

dir=$(mkdir -p "$dir" && cd "$dir" && pwd)
mkdir -p "$dir/state" "$dir/spool" "$dir/munge"
chmod 755 "$dir/munge"
user=$(id -un)

# munge: its own key, socket and state, so a host munged (if any) is not touched
head -c 1024 /dev/urandom > "$dir/munge/munge.key"
chmod 400 "$dir/munge/munge.key"
munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.sock" \
    --pid-file="$dir/munged.pid" --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed"

ctl_port=$(free_port)
{
    echo "ClusterName=rankscope-test"
    echo "SlurmctldHost=localhost(127.0.0.1)"
    echo "SlurmctldPort=$ctl_port"
    echo "SlurmUser=$user"
    echo "SlurmdUser=$user"
    echo "AuthType=auth/munge"
    echo "AuthInfo=socket=$dir/munge/munge.sock"
    echo "CredType=cred/munge"
    echo "StateSaveLocation=$dir/state"
    echo "SlurmdSpoolDir=$dir/spool/%n"
    echo "SlurmctldPidFile=$dir/slurmctld.pid"
    echo "SlurmdPidFile=$dir/slurmd-%n.pid"
    echo "SlurmctldLogFile=$dir/slurmctld.log"
    echo "SlurmdLogFile=$dir/slurmd-%n.log"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "SelectType=select/linear"
    echo "SchedulerType=sched/builtin"
    echo "SwitchType=switch/none"
    echo "MpiDefault=none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "JobCompType=jobcomp/none"
    echo "ReturnToService=2"
    echo "SlurmctldTimeout=30"
    echo "SlurmdTimeout=30"
    echo "MinJobAge=600"
    echo "JobRequeue=1"
    for i in $(seq 1 "$nodes"); do
        echo "NodeName=node$i NodeHostname=localhost NodeAddr=127.0.0.1 Port=$(free_port) CPUs=1 RealMemory=256 State=UNKNOWN"
    done
    echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
} > "$dir/slurm.conf"
echo "" > "$dir/cgroup.conf"
export SLURM_CONF=$dir/slurm.conf

slurmctld -f "$dir/slurm.conf"
for i in $(seq 1 "$nodes"); do
    mkdir -p "$dir/spool/node$i"
    slurmd -f "$dir/slurm.conf" -N "node$i"
done

# wait until every node answers and is idle
for _ in $(seq 150); do
    if [[ $(sinfo -h -N -o '%N %t' 2>/dev/null | grep -c ' idle') -ge $nodes ]]; then
        echo "export SLURM_CONF=$dir/slurm.conf"
        exit 0
    fi
    sleep 0.2
done
echo "slurm cluster in $dir did not come up; last log lines:" >&2
tail -n 5 "$dir/slurmctld.log" "$dir"/slurmd-*.log >&2 2>/dev/null || true
sinfo -N >&2 || true
exit 1
