#!/usr/bin/env bash
# Install and configure rootful podman so reprobox images build and run on a Debian bookworm
# machine (a VM without systemd, cgroup v1, no CAP_SYS_RESOURCE, no container registry).
# Idempotent: installs only what is missing, rewrites the config only when it differs.
# Needs root. Prints "setup-podman: ok" when a container can be created.
set -euo pipefail

[[ $(id -u) == 0 ]] || { echo "setup-podman: must run as root" >&2; exit 2; }

# podman 4.3 (bookworm) + runc: crun is not needed. uidmap, containernetworking-plugins:
# podman's hard dependencies for user namespaces and the default CNI bridge network.
# debootstrap: images/base/build-base.sh builds the base image from Debian packages.
pkgs=(podman runc uidmap containernetworking-plugins debootstrap)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  apt-get update -q
  # --no-install-recommends: skips fuse-overlayfs/slirp4netns/buildah (rootless-only extras).
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# Resource limits. Without CAP_SYS_RESOURCE a process cannot raise a hard rlimit, yet podman
# asks runc for nofile=1048576 and nproc=4194304 by default and every container fails with
#   "error setting rlimit type 7 (nofile) / 6 (nproc): operation not permitted".
# So pin container defaults to what this machine allows: nofile = our hard limit (20000 here);
# nproc = our hard limit, capped at 32768 because podman lowers its own RLIMIT_NPROC to 32768
# at start-up and a container cannot exceed its engine's limit.
nofile=$(ulimit -Hn); nproc=$(ulimit -Hu)
[[ $nofile == unlimited ]] && nofile=1048576
[[ $nproc == unlimited || $nproc -gt 32768 ]] && nproc=32768
conf_d=/etc/containers/containers.conf.d
want=$(cat <<EOF
# Written by reprobox images/setup-podman.sh; see the comments there.
[containers]
default_ulimits = ["nofile=${nofile}:${nofile}", "nproc=${nproc}:${nproc}"]

[engine]
# No systemd here (PID 1 is not systemd): cgroupfs, and events to a file, not journald.
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
)
mkdir -p "$conf_d"
if [[ "$(cat "$conf_d/50-reprobox.conf" 2>/dev/null)" != "$want" ]]; then
  printf '%s\n' "$want" >"$conf_d/50-reprobox.conf"
fi

# Storage: say "overlay" explicitly, so a kernel or filesystem without overlay fails loudly
# instead of silently falling back to vfs (which fails later, slowly, on these machines).
storage=/etc/containers/storage.conf
if ! grep -qs '^driver *= *"overlay"' "$storage"; then
  cat >"$storage" <<'EOF'
# Written by reprobox images/setup-podman.sh: rootful overlay storage, podman's default paths.
[storage]
driver = "overlay"
runroot = "/run/containers/storage"
graphroot = "/var/lib/containers/storage"
EOF
fi

# Check: create and run a container. `podman info` alone passes even when every container
# fails (the rlimit error above), and no image exists yet, so run /bin/true from a throwaway
# rootfs holding just that binary and its libraries (--rootfs needs no image or registry).
root=$(mktemp -d "${TMPDIR:-/tmp}/setup-podman.XXXXXX")
trap 'rm -rf "$root"' EXIT
for f in /bin/true $(ldd /bin/true | grep -o '/[^ ]*'); do
  mkdir -p "$root$(dirname "$f")" && cp -L "$f" "$root$f"
done
if ! out=$(podman run --rm --network none --rootfs "$root" /bin/true 2>&1); then
  echo "setup-podman: podman is installed but cannot run a container:" >&2
  echo "$out" >&2
  exit 3
fi
info=$(podman info --format '{{.Store.GraphDriverName}} {{.Host.OCIRuntime.Name}} {{.Host.CgroupManager}}')
echo "setup-podman: ok (podman $(podman version --format '{{.Client.Version}}'), $info, nofile=$nofile nproc=$nproc)"
