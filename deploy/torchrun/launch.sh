#!/bin/sh
# Launch a training script on N simulated NeuronCores of this host, or of one host in a
# multi-host job. Usage:
#
#   deploy/torchrun/launch.sh [-n RANKS_PER_HOST] [-N HOSTS -r HOST_RANK -a RDZV_HOST:PORT] SCRIPT [ARGS...]
#
# One host (the default): torchrun --standalone, RANKS_PER_HOST ranks (default 2).
# Several hosts: run this on every host with the same -N and -a (the rendezvous endpoint:
# host 0's address and a free port) and its own -r (0 .. N-1). Each rank drives the core
# LOCAL_RANK (or NEURON_RT_VISIBLE_CORES), and collectives between hosts are priced as EFA.
#
# Compiles go to the host's daemon: the systemd one when TRNSIM_DAEMON is set (e.g.
# TRNSIM_DAEMON=unix:/run/trnsim/compiler.sock, deploy/systemd/), else each host's own,
# started on first use.
set -eu
ranks=2 hosts=1 host_rank=0 endpoint=""
while getopts n:N:r:a: opt; do
    case $opt in
        n) ranks=$OPTARG ;;
        N) hosts=$OPTARG ;;
        r) host_rank=$OPTARG ;;
        a) endpoint=$OPTARG ;;
        *) sed -n 2,16p "$0"; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { sed -n 2,16p "$0"; exit 2; }
if [ -n "${TRNSIM_DAEMON:-}" ]; then
    export NEURON_COMPILE_DAEMON="$TRNSIM_DAEMON"
fi
if [ "$hosts" -eq 1 ]; then
    exec torchrun --standalone --nproc-per-node "$ranks" "$@"
fi
[ -n "$endpoint" ] || { echo "launch.sh: -N $hosts needs -a RDZV_HOST:PORT" >&2; exit 2; }
exec torchrun --nnodes "$hosts" --node-rank "$host_rank" --nproc-per-node "$ranks" \
    --rdzv-backend c10d --rdzv-endpoint "$endpoint" --rdzv-id "${TRNSIM_JOB:-trnsim}" "$@"
