#!/usr/bin/env bash
# What the repros and the test suite need from the system, installed where this machine
# allows it (`make test` and `make repro` run this first):
#   g++, ninja        DeepSpeed JIT-builds a small C++ op on CPU (the kl repro)
#   podman            the container tests build and run real images (images/setup-podman.sh)
#   the base image    a local python:3.11 stand-in, no registry needed (images/base/build-base.sh)
#   slurm-wlm, munge  the Slurm back end's tests start a single-node cluster (scripts/slurm-cluster.sh)
#   cmark-gfm         the report tests render comment.md as GitHub does (tests/test_comment_render.py)
# As root on Debian (or with password-less sudo) it installs what is missing; elsewhere it
# stops at once with one line naming what is missing and the command that installs it.
# Idempotent: when everything is there it only looks (well under a second).
#
# Usage: setup-system.sh [--no-containers] [--dry-run]
#   --no-containers   only the compilers (`make repro` runs no container and no Slurm job)
#   --dry-run         say what would be installed, install nothing
# Env: REPROBOX_SKIP_CONTAINERS=1 leaves the container pieces out (the container tests are then
#      left out knowingly); REPROBOX_BASE_IMAGE: a pullable base instead of the local one;
#      REPROBOX_SKIP_SLURM=1 leaves slurm-wlm and munge out (and the Slurm tests, knowingly).
set -euo pipefail
cd "$(dirname "$0")/.."

containers=1 slurm=1 tests=1 dry=
for arg in "$@"; do
  case $arg in
    --no-containers) containers= slurm= tests= ;;
    --dry-run) dry=1 ;;
    *) echo "setup-system: unknown argument: $arg" >&2; exit 2 ;;
  esac
done
[[ ${REPROBOX_SKIP_CONTAINERS:-} == 1 ]] && containers=
[[ ${REPROBOX_SKIP_SLURM:-} == 1 ]] && slurm=
base=${REPROBOX_BASE_IMAGE:-localhost/reprobox-base:bookworm-py3.11}

# What is missing: Debian packages, and the two container steps.
pkgs=() missing=() steps=()
command -v g++ >/dev/null || { pkgs+=(g++); missing+=(g++); }
command -v ninja >/dev/null || { pkgs+=(ninja-build); missing+=(ninja); }
# DeepSpeed's JIT-built op includes Python.h of the interpreter the repro venvs use (uv picks
# python3.11 from PATH): Debian's python3 ships without it.
py=$(command -v python3.11 || command -v python3 || true)
if [[ -n $py ]] && ! "$py" -c 'import os, sysconfig, sys
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
  pkgs+=(python3-dev); missing+=("Python headers (python3-dev)")
fi
engine=
if [[ $containers ]]; then
  for name in podman docker; do
    if command -v "$name" >/dev/null && "$name" info >/dev/null 2>&1; then engine=$name; break; fi
  done
  if [[ -z $engine ]]; then
    missing+=("a container engine (podman)")
    steps+=("bash images/setup-podman.sh")
  fi
  if [[ $base == localhost/* ]] && ! { [[ $engine ]] && "$engine" image exists "$base" 2>/dev/null; }; then
    missing+=("the base image $base")
    steps+=("bash images/base/build-base.sh $base")
  fi
fi
if [[ $slurm ]] && ! { command -v sbatch && command -v slurmctld && command -v munged; } >/dev/null; then
  pkgs+=(slurm-wlm munge)
  missing+=("slurm (slurm-wlm, munge)")
fi
if [[ $tests ]] && ! command -v cmark-gfm >/dev/null; then
  pkgs+=(cmark-gfm); missing+=(cmark-gfm)
fi
((${#missing[@]})) || exit 0

# Who can install it: root, or password-less sudo (a stock CI runner); else say how, once.
as=()
if [[ $(id -u) != 0 ]]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    as=(sudo)
  else
    as=(none)
  fi
fi
joined() { local out=$1 item; shift; for item in "$@"; do out+=", $item"; done; printf '%s' "$out"; }
# Images built by root's podman are not seen by a user's rootless podman: building the local
# base with sudo would leave the tests without it.
if [[ ${as[0]:-} == sudo && $base == localhost/* && ${#steps[@]} -gt 0 ]]; then
  echo "setup-system: missing $(joined "${missing[@]}"); a user's podman does not see images" \
    "root builds: set REPROBOX_BASE_IMAGE=docker.io/library/python:3.11-slim (pulled), or run" \
    "as root" >&2
  exit 2
fi
commands=()
((${#pkgs[@]})) && commands+=("apt-get update" "apt-get install -y ${pkgs[*]}")
commands+=("${steps[@]}")
if [[ ${as[0]:-} == none ]] || ! command -v apt-get >/dev/null || ! command -v dpkg-query >/dev/null; then
  how=$(printf ' && sudo %s' "${commands[@]}")
  skip=${containers:+ (or REPROBOX_SKIP_CONTAINERS=1 to leave the container tests out)}
  echo "setup-system: missing $(joined "${missing[@]}"); as root on Debian install with:${how# &&}${skip}" >&2
  exit 2
fi

if [[ $dry ]]; then
  printf 'setup-system: would run: %s\n' "${commands[@]}"
  exit 0
fi
if ((${#pkgs[@]})); then
  echo "setup-system: installing ${pkgs[*]}"
  "${as[@]}" apt-get update -qq
  "${as[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}"
fi
for step in "${steps[@]}"; do
  read -r -a argv <<<"$step"
  "${as[@]}" "${argv[@]}"
done
echo "setup-system: installed ${missing[*]}"
