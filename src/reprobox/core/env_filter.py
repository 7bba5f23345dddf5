"""Which of the harness's environment variables reach what it starts.

The harness's own environment holds whatever the user's shell or the CI job holds: cloud
keys, `HF_TOKEN`, `GH_TOKEN`, an index password. None of it is any business of a rank, of
the `setup.py` of an sdist being built during a bisect, or of a preflight. So every process
the harness starts gets an explicit set: what the launchers and the stack need (`for_launch`),
or what uv needs to reach an index (`for_uv`), plus the names a repro asks for in
`[launch] pass_env`. Names that look like credentials are left out even where a prefix
(`NCCL_`, `TORCH_`) would let them through, unless asked for by name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

# A variable name as shells and repro.toml's pass_env spell it.
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# What any process needs to run at all: where programs are, who and where it is, its locale.
BASE = frozenset(
    {
        "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TERM",
        "COLUMNS", "NO_COLOR", "FORCE_COLOR", "TMPDIR", "TMP", "TEMP",
        "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_RUNTIME_DIR",
    }
)  # fmt: skip
# Reaching the network through a proxy that may intercept TLS.
NETWORK = frozenset(
    {
        "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",
        "http_proxy", "https_proxy", "no_proxy", "all_proxy",
        "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
    }
)  # fmt: skip
# The stack's own knobs: devices, collectives, threads, compilers for JIT-built ops, and the
# Hugging Face switches that keep it offline (never HF_TOKEN, never HF_HOME's token file).
STACK = frozenset(
    {
        "LD_LIBRARY_PATH", "CC", "CXX", "MAX_JOBS", "NVIDIA_VISIBLE_DEVICES",
        "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE",
        "HF_HUB_DISABLE_TELEMETRY", "HF_HUB_DISABLE_PROGRESS_BARS",
        "HF_HUB_DISABLE_IMPLICIT_TOKEN", "DO_NOT_TRACK",
    }
)  # fmt: skip
STACK_PREFIXES = (
    "LC_", "CUDA_", "NCCL_", "GLOO_", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "TORCH_",
    "PYTORCH_", "TORCHINDUCTOR_", "TRITON_",
)  # fmt: skip
# What a source build (a native extension) reads besides the base set.
BUILD = frozenset({"LD_LIBRARY_PATH", "CC", "CXX", "CFLAGS", "CXXFLAGS", "LDFLAGS", "MAX_JOBS"})
BUILD_PREFIXES = ("LC_", "CUDA_", "TORCH_")
# uv reads its settings (index URLs and their credentials included) from UV_*: it needs them
# to resolve and install, and gets them; the ranks never do.
UV_PREFIX = "UV_"

# Name parts that mark a credential (`NCCL_SOCKET_IFNAME` passes, `TORCH_HUB_TOKEN` does not).
_SECRET = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|APIKEY|(?:^|_)(?:KEY|AUTH|PRIVATE)(?:_|$)")


def looks_secret(name: str) -> bool:
    """Whether a variable name suggests it holds a credential."""
    return bool(_SECRET.search(name.upper()))


def for_launch(environ: Mapping[str, str], pass_env: Iterable[str] = ()) -> dict[str, str]:
    """The part of `environ` a launched process (a rank, a preflight, a launcher) gets:
    the base set, the network settings, the stack's knobs, and the names in `pass_env`."""
    wanted = set(pass_env)
    return {
        name: value
        for name, value in environ.items()
        if name in wanted
        or (
            (name in BASE or name in NETWORK or name in STACK or name.startswith(STACK_PREFIXES))
            and not looks_secret(name)
        )
    }


def for_uv(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of `environ` uv gets (and so the source builds it runs): the base set, the
    network settings, uv's own UV_* settings, and what a compiler of a native extension
    reads (compilers, flags, CUDA and torch's build settings)."""
    return {
        name: value
        for name, value in environ.items()
        if name.startswith(UV_PREFIX)
        or name in BASE
        or name in NETWORK
        or ((name in BUILD or name.startswith(BUILD_PREFIXES)) and not looks_secret(name))
    }
