#!/bin/sh
# Install a repro's hashed lock into /opt/venv, inside an image build (every
# images/<repro>/Dockerfile runs this). The lock is the very file the nox environment uses;
# nothing else is installed. Expects, from the build context:
#   /opt/reprobox/lock.txt   the lock; LOCK_SHA256 (build arg) must match it
#   /tmp/wheels/             wheels that no reachable index serves (e.g. CPU torch); may be empty
#   /tmp/tools/uv            optional: the harness's uv (fast); pip is the fallback
#   /run/secrets/ca          optional: an extra CA bundle for a TLS-intercepting proxy, used for
#                            this step only, never written into a layer
# and the build args INSTALL_ENV ("K=V K=V", e.g. DS_BUILD_OPS=0) and NO_BUILD_ISOLATION
# (packages whose source build imports others from the lock, e.g. deepspeed needs torch:
# they are installed last, against the venv, without build isolation).
set -eu
lock=/opt/reprobox/lock.txt
if [ "${LOCK_SHA256:-unset}" != unset ]; then
  echo "$LOCK_SHA256  $lock" > /tmp/lock.sha256
  sha256sum -c /tmp/lock.sha256 || { echo "install-lock: lock hash mismatch" >&2; exit 3; }
fi
if [ -s /run/secrets/ca ]; then
  cat /etc/ssl/certs/ca-certificates.crt /run/secrets/ca > /tmp/ca.pem
  export SSL_CERT_FILE=/tmp/ca.pem PIP_CERT=/tmp/ca.pem
fi
for setting in ${INSTALL_ENV:-}; do export "${setting?}"; done
python3 -m venv /opt/venv

# Split the lock: the NO_BUILD_ISOLATION packages' entries go to a second file.
python3 - "$lock" ${NO_BUILD_ISOLATION:-} <<'SPLIT'
import re, sys
lock, late = sys.argv[1], {re.sub(r"[-_.]+", "-", n).lower() for n in sys.argv[2:]}
first, second, target = [], [], None
for line in open(lock):
    if line[:1] not in ("", " ", "#", "\n"):
        name = re.sub(r"[-_.]+", "-", re.split(r"[=<>!~ ;\[]", line, maxsplit=1)[0]).lower()
        target = second if name in late else first
    (target if target is not None else first).append(line)
open("/tmp/lock-first.txt", "w").writelines(first)
open("/tmp/lock-late.txt", "w").writelines(second)
SPLIT

# Bytecode at build time: the image's user cannot write it into /opt/venv at run time.
install() {
  if [ -x /tmp/tools/uv ]; then
    /tmp/tools/uv pip install --no-cache --no-deps --require-hashes --compile-bytecode \
      --python /opt/venv/bin/python --find-links /tmp/wheels "$@"
  else
    /opt/venv/bin/pip install --no-cache-dir --no-deps --require-hashes \
      --find-links /tmp/wheels "$@"
  fi
}
install -r /tmp/lock-first.txt
if grep -q '==' /tmp/lock-late.txt; then
  install --no-build-isolation -r /tmp/lock-late.txt
fi
rm -f /tmp/ca.pem /tmp/lock.sha256 /tmp/lock-first.txt /tmp/lock-late.txt
# The user the image runs as (numeric in USER, so Kubernetes' runAsNonRoot can verify it).
useradd --create-home --uid 10001 --user-group repro
mkdir -p /out && chown repro:repro /out
