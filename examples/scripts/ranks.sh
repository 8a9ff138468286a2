#!/bin/sh
# Any executable runs as an MPI rank: this one says who it is, from the launcher's own variables.
# `ranks.sh --fail-on N` exits 1 on rank N, as a failing program would.
echo "rank ${PMI_RANK} of ${PMI_SIZE} (local ${MPI_LOCALRANKID} of ${MPI_LOCALNRANKS}) on node rank ${NODE_RANK}"
if [ "$1" = "--fail-on" ] && [ "$2" = "${PMI_RANK}" ]; then
    echo "rank ${PMI_RANK}: giving up" >&2
    exit 1
fi
