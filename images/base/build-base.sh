#!/usr/bin/env bash
# Build a local stand-in for python:3.11-slim from Debian packages and import it into podman.
#
# Why: no container registry is reachable here, so `FROM python:3.11-slim` cannot be pulled.
# Debian bookworm's python3 is 3.11.x, so a debootstrap'ed bookworm with python3 + venv + pip
# is close enough for CPU repros. Build with it:  --build-arg BASE=<the image name below>.
#
# Usage: build-base.sh [IMAGE]     (default localhost/reprobox-base:bookworm-py3.11)
# Env:   DEBIAN_MIRROR  (default: debootstrap's own)
#        ENGINE         (default podman)
# Idempotent: exits 0 at once when IMAGE already exists. Needs root (debootstrap chroots).
set -euo pipefail

IMAGE=${1:-localhost/reprobox-base:bookworm-py3.11}
MIRROR=${DEBIAN_MIRROR:-}
ENGINE=${ENGINE:-podman}
# python-is-python3: the official image has a `python` command; scripts call it.
PACKAGES=python3,python3-venv,python3-pip,python-is-python3,ca-certificates

command -v "$ENGINE" >/dev/null || { echo "build-base: $ENGINE not found (run images/setup-podman.sh)" >&2; exit 2; }
if "$ENGINE" image exists "$IMAGE"; then
  echo "build-base: $IMAGE exists, skipping"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "build-base: debootstrap missing (apt-get install debootstrap)" >&2; exit 2; }

start=$SECONDS
work=$(mktemp -d "${TMPDIR:-/tmp}/reprobox-base.XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/rootfs

# TLS-intercepting proxies: debootstrap downloads with the HOST's wget and the host trust
# store, so an https mirror works whenever the host trusts the proxy CA. We still point wget
# at the CA bundle Python reports (honours $SSL_CERT_FILE) in case the default store differs.
ca=$(python3 -c 'import ssl,os; p=ssl.get_default_verify_paths(); print(os.environ.get("SSL_CERT_FILE") or p.cafile or p.openssl_cafile)' 2>/dev/null || true)
if [[ $MIRROR == https:* && -r $ca ]]; then
  export WGETRC=$work/wgetrc
  printf 'ca_certificate = %s\n' "$ca" >"$WGETRC"
fi

debootstrap --variant=minbase --include="$PACKAGES" bookworm "$root" ${MIRROR:+"$MIRROR"}

# Slim it down like the official -slim images: no apt lists, caches, docs, man pages.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
       "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/var/log/*.log
# The official python image lets `pip install` into the system Python; Debian marks it
# externally managed (PEP 668). Drop the marker so both bases behave alike.
rm -f "$root"/usr/lib/python3*/EXTERNALLY-MANAGED
# debootstrap copied the host's resolv.conf; the engine bind-mounts its own at run time.
: >"$root"/etc/resolv.conf
# No snapshot mirror is reachable, so the base follows Debian's point releases: record the
# exact python3.11 package in a label so results can name it.
# shellcheck disable=SC2016  # ${Version} is dpkg-query's format, not a shell variable
pyver=$(chroot "$root" dpkg-query -W -f='${Version}' python3.11)

# The image deliberately carries only Debian's CA bundle, never the host's proxy CA: builds
# that need the proxy CA mount it (see images/lm_head/Dockerfile, secret id "ca").
tar --numeric-owner -C "$root" -c . |
  "$ENGINE" import --quiet \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["python3"]' \
    --change "LABEL org.reprobox.base.debian-python3.11=$pyver" \
    --change 'LABEL org.opencontainers.image.description="debootstrap bookworm minbase + python3, stand-in for python:3.11-slim"' \
    - "$IMAGE" >/dev/null

py=$("$ENGINE" run --rm "$IMAGE" python --version)
echo "build-base: built $IMAGE ($py) in $((SECONDS - start))s"
