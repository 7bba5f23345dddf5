#!/bin/sh
# Install a repro's hashed lock into /opt/venv, inside an image build (every
# images/<repro>/Dockerfile runs this). The lock is the very file the nox environment uses;
# nothing else is installed. Expects, from the build context:
#   /opt/reprobox/lock.txt   the lock; LOCK_SHA256 (build arg) must match it
#   /tmp/wheels/             wheels that no reachable index serves (e.g. CPU torch); may be empty
#   /tmp/tools/uv            optional: the harness's uv (fast); pip is the fallback
#   /run/secrets/ca          optional: an extra CA bundle for a TLS-intercepting proxy, used for
#                            this step only, never written into a layer
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
python3 -m venv /opt/venv
# Bytecode at build time: the image's user cannot write it into /opt/venv at run time.
if [ -x /tmp/tools/uv ]; then
  /tmp/tools/uv pip sync --no-cache --require-hashes --compile-bytecode \
    --python /opt/venv/bin/python --find-links /tmp/wheels "$lock"
else
  /opt/venv/bin/pip install --no-cache-dir --no-deps --require-hashes \
    --find-links /tmp/wheels -r "$lock"
fi
rm -f /tmp/ca.pem /tmp/lock.sha256
# The user the image runs as (numeric in USER, so Kubernetes' runAsNonRoot can verify it).
useradd --create-home --uid 10001 --user-group repro
mkdir -p /out && chown repro:repro /out
