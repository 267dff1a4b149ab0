#!/usr/bin/env bash
# A single-node Slurm cluster on localhost (Debian's munge, slurmctld, slurmd), used by
# `make slurm-test` to run the job array that `lab sweep --emit-slurm` writes.
#
#   scripts/slurm-local.sh start DIR   install the packages if needed (apt-get, root), write
#                                      DIR/slurm.conf, start munged, slurmctld and slurmd with
#                                      state in DIR; prints `export SLURM_CONF=DIR/slurm.conf`
#   scripts/slurm-local.sh stop DIR    stop the daemons started by `start DIR`
#   scripts/slurm-local.sh test        start a cluster in a temporary folder, run the block-width
#                                      smoke sweep as a 3-task job array, merge the shards, check
#                                      that the merged tables equal a local run's, stop
#
# Needs root (the daemons and apt-get). Nothing outside DIR is changed except the installed
# packages and munge's key (/etc/munge/munge.key, created by the package).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
LAB="${LAB:-$ROOT/target/release/lab}"

install_packages() {
    if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
        || ! command -v munged >/dev/null || ! command -v sbatch >/dev/null; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurmctld slurmd slurm-client munge
    fi
}

start() {
    local dir="$1"
    install_packages
    mkdir -p "$dir/state" "$dir/spool" "$dir/log" "$dir/munge"
    dir="$(cd "$dir" && pwd)"
    local host node
    host="$(hostname -s)"
    # The node's real CPUs and memory, as slurmd sees them.
    node="$(slurmd -C | head -1)"
    cat >"$dir/slurm.conf" <<EOF
ClusterName=lab-local
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
$node State=UNKNOWN
PartitionName=local Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    # munge: the package's key; our own socket and pid file under DIR.
    if [ ! -s /etc/munge/munge.key ]; then mungekey --create --keyfile=/etc/munge/munge.key; fi
    chmod 0600 /etc/munge/munge.key
    munged --force --socket="$dir/munge/munge.socket" --pid-file="$dir/munge/munged.pid" \
        --log-file="$dir/log/munged.log" --seed-file="$dir/munge/seed"
    # Slurm's munge plugin reads the socket path from AuthInfo.
    sed -i "s|^AuthType=auth/munge|AuthType=auth/munge\nAuthInfo=socket=$dir/munge/munge.socket|" "$dir/slurm.conf"
    sed -i "s|^CredType=cred/munge|CredType=cred/munge|" "$dir/slurm.conf"
    export SLURM_CONF="$dir/slurm.conf"
    slurmctld -f "$SLURM_CONF" -i
    slurmd -f "$SLURM_CONF"
    # Wait for the node to come up.
    for _ in $(seq 1 60); do
        if sinfo -h -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
            echo "export SLURM_CONF=$SLURM_CONF"
            return 0
        fi
        sleep 1
    done
    echo "slurm-local: the node did not come up; logs in $dir/log" >&2
    sinfo >&2 || true
    tail -20 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" >&2 || true
    return 1
}

stop() {
    local dir="$1"
    for pidfile in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
        if [ -s "$pidfile" ]; then
            kill "$(cat "$pidfile")" 2>/dev/null || true
        fi
    done
    sleep 1
}

run_test() {
    [ -x "$LAB" ] || { echo "slurm-local: build lab first (cargo build --release)" >&2; exit 1; }
    SLURM_TEST_DIR="$(mktemp -d /tmp/lab-slurm.XXXXXX)"
    local dir="$SLURM_TEST_DIR"
    trap 'stop "$SLURM_TEST_DIR/cluster"; rm -rf "$SLURM_TEST_DIR"' EXIT
    start "$dir/cluster" >/dev/null
    export SLURM_CONF="$dir/cluster/slurm.conf"
    echo "slurm-local: cluster up: $(sinfo -h -o '%P %D nodes %c CPUs %m MB %T')"
    local out="$dir/bw"
    "$LAB" sweep block-width --preset smoke --emit-slurm "$dir/bw.sbatch" \
        --slurm-shards 3 --slurm-cpus 1 --slurm-mem 1G --slurm-time 00:10:00 --out "$out"
    echo "slurm-local: emitted script:"
    sed 's/^/    /' "$dir/bw.sbatch"
    local t0=$SECONDS
    sbatch --wait "$dir/bw.sbatch"
    echo "slurm-local: job array finished in $((SECONDS - t0)) s"
    local logs
    logs="$(ls "$out"/slurm-*.log | wc -l)"
    echo "slurm-local: $logs array task logs; last lines:"
    for f in "$out"/slurm-*.log; do echo "    $(basename "$f"): $(tail -1 "$f")"; done
    "$LAB" merge "$out"/shard-* --out "$out" | tail -1
    "$LAB" sweep block-width --preset smoke --no-progress --out "$dir/local" >/dev/null 2>&1
    python3 "$ROOT/scripts/compare_results.py" "$dir/local" "$out"
    echo "slurm-local: test took $SECONDS s (cluster start, array, merge, local run, comparison)"
}

case "${1:-}" in
    start) start "${2:?usage: $0 start DIR}" ;;
    stop) stop "${2:?usage: $0 stop DIR}" ;;
    test) run_test ;;
    *) echo "usage: $0 start DIR | stop DIR | test" >&2; exit 2 ;;
esac
