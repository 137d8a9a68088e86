#!/usr/bin/env bash
# A throw-away Slurm cluster on this machine, for trying the sbatch scripts and for the tests.
#
#   scripts/slurm/local_cluster.sh up [DIR]       start it; prints `export SLURM_CONF=DIR/slurm.conf`
#   scripts/slurm/local_cluster.sh status [DIR]   nodes, partitions and jobs
#   scripts/slurm/local_cluster.sh down [DIR]     cancel every job, stop the daemons, keep DIR
#
# DIR (default: $SLURM_LOCAL_DIR, else a new folder under /tmp for `up`) holds everything: the
# config, a private munge key and socket, daemon state, logs and PID files. Nothing under /etc is
# written and no system service is touched, so it runs next to a real Slurm installation.
# Needs root (the daemons run as root here) and the Debian/Ubuntu packages
#   apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge
#
# The cluster mirrors the course cluster: partitions `debug` (5 minutes, default) and `normal`
# (20 minutes), two nodes with GPUs (fake: /dev/null devices, so CUDA is absent and code must
# fall back to CPU). Nodes declare more CPUs and GPUs than this machine may have, so that the
# shipped scripts' requests fit unchanged. Settings, as environment variables:
#   SLURM_LOCAL_NODES=2           emulated nodes (each a slurmd on its own port)
#   SLURM_LOCAL_CPUS_PER_NODE=8   CPUs each node declares (all nodes share this machine's cores)
#   SLURM_LOCAL_GPUS_PER_NODE=2   fake GPUs each node declares (0 for none)
set -euo pipefail

readonly NUM_NODES="${SLURM_LOCAL_NODES:-2}"
readonly CPUS_PER_NODE="${SLURM_LOCAL_CPUS_PER_NODE:-8}"
readonly GPUS_PER_NODE="${SLURM_LOCAL_GPUS_PER_NODE:-2}"
# How long `up` waits for the nodes to register, and `down` for jobs and daemons to end.
readonly START_TIMEOUT_S=60
readonly STOP_TIMEOUT_S=30

die() {
    echo "error: $*" >&2
    exit 2
}

usage() {
    echo "usage: $0 up|down|status [DIR]   (DIR defaults to \$SLURM_LOCAL_DIR)" >&2
    exit 2
}

# Node names are loopback addresses: they resolve on any machine, which a multi-node rendezvous
# on MASTER_ADDR=<first node> needs (names like n1 do not resolve).
node_names() {
    local i
    for ((i = 2; i < 2 + NUM_NODES; i++)); do
        echo "127.0.0.$i"
    done
}

# A free block of consecutive TCP ports: one for slurmctld, one per slurmd.
find_free_ports() {
    python3 - "$1" <<'EOF'
import random, socket, sys

count = int(sys.argv[1])
for _ in range(200):
    base = random.randrange(20000, 60000 - count)
    sockets = []
    try:
        for port in range(base, base + count):
            s = socket.socket()
            sockets.append(s)
            s.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        for s in sockets:
            s.close()
    print(base)
    sys.exit(0)
sys.exit("no free block of ports found")
EOF
}

# True while PID is a live process named NAME (a zombie waiting to be reaped counts as gone; the
# name check keeps a stale PID file from hitting an unrelated process that reused the PID).
is_running() {
    local pid="$1" name="$2" stat comm state
    # /proc/PID/stat reads "PID (COMM) STATE ..." (no procps needed: slurm does not pull it in).
    stat="$(cat "/proc/$pid/stat" 2>/dev/null)" || return 1
    comm="${stat#*(}"
    comm="${comm%%)*}"
    state="${stat##*) }"
    state="${state%% *}"
    [[ "$state" != Z && "$comm" == "$name" ]]
}

# Start a daemon in the foreground of its own session and record its PID.
start_daemon() {
    local name="$1"
    shift
    setsid "$@" >"$DIR/log/$name.out" 2>&1 </dev/null &
    echo $! >"$DIR/run/$name.pid"
}

write_config() {
    local ctld_port="$1" node gres=""
    if ((GPUS_PER_NODE > 0)); then
        gres="Gres=gpu:$GPUS_PER_NODE"
        # A GPU GRES without device files is dropped and the node goes INVAL: point at /dev/null.
        : >"$DIR/gres.conf"
        for node in $(node_names); do
            local i
            for ((i = 0; i < GPUS_PER_NODE; i++)); do
                ln -sf /dev/null "$DIR/dev/$node-gpu$i"
            done
            echo "NodeName=$node Name=gpu File=$DIR/dev/$node-gpu[0-$((GPUS_PER_NODE - 1))]" \
                >>"$DIR/gres.conf"
        done
    fi
    cat >"$DIR/slurm.conf" <<EOF
# Written by scripts/slurm/local_cluster.sh: a one-machine cluster, all state in $DIR.
ClusterName=local
SlurmctldHost=localhost
SlurmctldPort=$ctld_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CryptoType=crypto/munge
# Our own munged; a short credential lifetime lets a requeued job restart in ~30 s, not ~150 s.
AuthInfo=socket=$DIR/munge/munge.socket,cred_expire=10
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# Nodes may declare more CPUs, memory and GPUs than this machine has.
SlurmdParameters=config_overrides
GresTypes=gpu
ReturnToService=2
MailProg=/bin/true
# A job over the partition's time limit is refused at submission instead of pending forever.
EnforcePartLimits=ALL
# Finished jobs are forgotten after 4 s, so \`sbatch --wait\` returns quickly; lower loses exit codes.
MinJobAge=4
# Pending jobs that become eligible without an event (a requeued job after its credential
# expired) wait for the next scheduling pass: every 2 s here instead of every 60 s.
SchedulerParameters=sched_interval=2,bf_interval=2
StateSaveLocation=$DIR/state
SlurmctldPidFile=$DIR/run/slurmctld.pid.slurm
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdSpoolDir=$DIR/d-%n
SlurmdPidFile=$DIR/run/slurmd-%n.pid.slurm
SlurmdLogFile=$DIR/log/slurmd-%n.log
NodeName=127.0.0.[2-$((NUM_NODES + 1))] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[$((ctld_port + 1))-$((ctld_port + NUM_NODES))] CPUs=$CPUS_PER_NODE $gres State=UNKNOWN
PartitionName=debug Nodes=ALL MaxTime=5 DefaultTime=5 Default=YES State=UP
PartitionName=normal Nodes=ALL MaxTime=20 DefaultTime=20 State=UP
EOF
}

cluster_up() {
    [[ $EUID -eq 0 ]] || die "the local cluster's daemons run as root; run this as root"
    local tool
    for tool in munged slurmctld slurmd sinfo; do
        command -v "$tool" >/dev/null \
            || die "$tool not found; install: apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge"
    done
    if [[ -f "$DIR/run/slurmctld.pid" ]] && is_running "$(cat "$DIR/run/slurmctld.pid")" slurmctld; then
        die "a cluster is already running in $DIR; stop it with: $0 down $DIR"
    fi
    mkdir -p "$DIR"/{munge,state,log,run,dev}
    chmod 700 "$DIR/munge"
    local node
    for node in $(node_names); do
        # slurmd does not create its spool folder; its domain socket lives there.
        mkdir -p "$DIR/d-$node"
    done

    local ctld_port
    ctld_port="$(find_free_ports $((NUM_NODES + 1)))"
    write_config "$ctld_port"

    if [[ ! -f "$DIR/munge/munge.key" ]]; then
        head -c 1024 /dev/urandom >"$DIR/munge/munge.key"
        chmod 400 "$DIR/munge/munge.key"
    fi
    start_daemon munged munged --foreground --force \
        --socket="$DIR/munge/munge.socket" --key-file="$DIR/munge/munge.key" \
        --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/log/munged.log" \
        --seed-file="$DIR/munge/munged.seed"
    wait_for "munged's socket" test -S "$DIR/munge/munge.socket"

    # -c: a fresh start, whatever state an earlier cluster in this folder left.
    start_daemon slurmctld slurmctld -D -c -f "$SLURM_CONF"
    for node in $(node_names); do
        start_daemon "slurmd-$node" slurmd -D -N "$node" -f "$SLURM_CONF"
    done
    wait_for "all $NUM_NODES nodes to be idle" nodes_idle
    echo "export SLURM_CONF=$SLURM_CONF"
}

nodes_idle() {
    local states
    states="$(sinfo -h -N -p debug -o %T 2>/dev/null)" || return 1
    [[ "$(grep -cx idle <<<"$states")" -eq "$NUM_NODES" ]]
}

wait_for() {
    local what="$1" deadline=$((SECONDS + START_TIMEOUT_S))
    shift
    until "$@"; do
        if ((SECONDS > deadline)); then
            echo "error: gave up waiting for $what after ${START_TIMEOUT_S}s; logs in $DIR/log:" >&2
            tail -n 5 "$DIR"/log/* >&2 || true
            cluster_down >/dev/null
            exit 1
        fi
        sleep 0.2
    done
}

cluster_down() {
    local deadline=$((SECONDS + STOP_TIMEOUT_S)) pid_file pid name
    # Jobs outlive their clients (`sbatch --wait` killed leaves the job running): cancel them all
    # while slurmctld still runs, and let their step daemons finish before stopping slurmd.
    if [[ -f "$DIR/run/slurmctld.pid" ]] && is_running "$(cat "$DIR/run/slurmctld.pid")" slurmctld; then
        scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
        # Each running step has a socket in its node's spool folder until its slurmstepd ends.
        while [[ -n "$(squeue -h -o %i 2>/dev/null)$(find "$DIR"/d-* -type s 2>/dev/null)" ]]; do
            ((SECONDS < deadline)) || break
            sleep 0.2
        done
    fi
    for pid_file in "$DIR"/run/slurmd-*.pid "$DIR/run/slurmctld.pid" "$DIR/run/munged.pid"; do
        [[ -f "$pid_file" ]] || continue
        pid="$(cat "$pid_file")"
        name="$(basename "$pid_file" .pid)" && name="${name%%-*}"  # run/slurmd-X.pid: slurmd
        if is_running "$pid" "$name"; then
            kill -TERM "$pid" 2>/dev/null || true
        fi
        while is_running "$pid" "$name"; do
            if ((SECONDS > deadline)); then
                kill -KILL "$pid" 2>/dev/null || true
                break
            fi
            sleep 0.1
        done
        rm -f "$pid_file"
    done
    echo "stopped the cluster in $DIR"
}

cluster_status() {
    [[ -f "$SLURM_CONF" ]] || die "no cluster in $DIR (no slurm.conf); start one with: $0 up $DIR"
    echo "export SLURM_CONF=$SLURM_CONF"
    sinfo
    squeue
}

[[ $# -ge 1 && $# -le 2 ]] || usage
DIR="${2:-${SLURM_LOCAL_DIR:-}}"
case "$1" in
up)
    [[ -n "$DIR" ]] || DIR="$(mktemp -d /tmp/slurm-local.XXXXXX)"
    mkdir -p "$DIR"
    ;;
down | status)
    [[ -n "$DIR" ]] || die "which cluster? give its folder: $0 $1 DIR (or set SLURM_LOCAL_DIR)"
    [[ -d "$DIR" ]] || die "no such folder: $DIR"
    ;;
*) usage ;;
esac
DIR="$(cd "$DIR" && pwd)"
# The daemons live in sbin, which a user's PATH may lack.
export SLURM_CONF="$DIR/slurm.conf" PATH="$PATH:/usr/sbin:/sbin"
"cluster_$1"
