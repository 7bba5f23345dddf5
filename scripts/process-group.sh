#!/usr/bin/env bash
# Runs a command in a process group of its own and passes a signal to this script (a
# cancelled CI job, a `kill` of make) to the whole group as SIGINT, which pytest answers by
# tearing its fixtures down (a test's Slurm daemons included); whatever is still there 30 s
# later is killed. `make test` runs the suite through it: a TERM used to stop make and nox
# alone, and pytest's workers and a test's Slurm cluster ran on for 20 minutes.
set -euo pipefail

stop() {
    trap '' INT TERM HUP
    kill -INT -- "-$group" 2>/dev/null || true
    for _ in $(seq 30); do
        kill -0 -- "-$group" 2>/dev/null || exit "$1"
        sleep 1
    done
    kill -KILL -- "-$group" 2>/dev/null || true
    exit "$1"
}

set -m
"$@" &
group=$!
set +m
trap 'stop 130' INT
trap 'stop 143' TERM
trap 'stop 129' HUP
wait "$group"
