"""Render `images/<repro>/Dockerfile` from repro.toml, as the locks are rendered.

Every repro's image is the same recipe with a few settings (bases, system packages), and
Dockerfiles cannot include one another, so the file is generated and committed: readable and
buildable by hand, yet one template to maintain. `nox -s lock` writes it; a test fails when
a committed Dockerfile differs from what repro.toml renders.
"""

from __future__ import annotations

from pathlib import Path

from reprobox.core.spec import Repro
from reprobox.run.layout import BUILD_WHEELS, IMAGE_USER, IN_IMAGE, OUT

HEADER = """\
# GENERATED from repros/{name}/repro.toml by `nox -s lock` - edit [image] there, or the template
# in src/reprobox/run/dockerfile.py, not this file.
#
# Pinned image of the {name} repro: {title}
# Build and run it with the harness, which assembles the build context (images/README.md):
#   nox -s image -- {name} --variant {variant} [--platform gpu] --run
# No "# syntax=" line: it would make BuildKit fetch a frontend from a registry.

ARG BASE={base}
ARG GPU_BASE={gpu_base}
"""

# Two targets, the same block each: buildah cannot pick a stage by a variable, and an empty
# "os" stage would be committed anew on every build, defeating the layer cache.
TARGET = """
FROM ${{{base_arg}}} AS {target}
{system}ARG LOCK_SHA256=unset
ARG INSTALL_ENV="{install_env}" NO_BUILD_ISOLATION="{no_build_isolation}"
COPY lock.txt install-lock.sh /opt/reprobox/
RUN --mount=type=bind,source=wheels,target={build_wheels} \\
    --mount=type=bind,source=tools,target=/tmp/tools \\
    --mount=type=secret,id=ca,target=/run/secrets/ca \\
    sh /opt/reprobox/install-lock.sh
# Declared after the install so variants sharing a lock share its (large) layer.
ARG REPRO={name} VARIANT={variant} REPRO_COMMAND=""
# A step that reads them: podman 4.3 (buildah) reuses a cached ENV or LABEL step whatever
# the build arguments, and would give a variant sharing a lock another variant's labels and
# default command; a RUN's cache key holds the arguments it sees.
RUN echo "$REPRO $VARIANT" > /opt/reprobox/variant
COPY --chown={uid}:{uid} repro/ {repro_dir}/
COPY --chown={uid}:{uid} fixes/ {fixes_dir}/
ENV PATH={venv}/bin:$PATH PYTHONPATH={fixes_dir} REPRO_RESULT={out}/result.json \\
    HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 REPRO_COMMAND=${{REPRO_COMMAND}}
LABEL org.reprobox.repro=${{REPRO}} org.reprobox.variant=${{VARIANT}} \\
      org.reprobox.target={target} org.reprobox.lock-sha256=${{LOCK_SHA256}}
USER {uid}:{uid}
WORKDIR {repro_dir}
CMD ["/bin/sh", "-c", "exec $REPRO_COMMAND"]
"""

APT = """\
# The distro's packages are fixed by the base tag; the lock pins everything Python.
# hadolint ignore=DL3008
RUN apt-get update \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\
      {packages} \\
 && rm -rf /var/lib/apt/lists/*
"""


def render(repro: Repro) -> str:
    image = repro.spec.image
    variant = (
        repro.default_variants[0] if repro.default_variants else next(iter(repro.spec.variants))
    )
    fields = {"name": repro.name, "title": repro.spec.repro.title, "variant": variant}
    paths = {"uid": IMAGE_USER, "repro_dir": IN_IMAGE["repro"], "fixes_dir": IN_IMAGE["fixes"],
             "venv": IN_IMAGE["venv"], "out": OUT, "build_wheels": BUILD_WHEELS}  # fmt: skip
    text = HEADER.format(**fields, base=image.base, gpu_base=image.gpu_base)
    cpu_packages = image.system_packages
    # CUDA images carry no Python: add the distro's (3.10 on Ubuntu 22.04).
    gpu_packages = ["python3", "python3-venv", "ca-certificates", *image.system_packages]
    for target, base_arg, packages in (("cpu", "BASE", cpu_packages),
                                       ("gpu", "GPU_BASE", gpu_packages)):  # fmt: skip
        system = APT.format(packages=" ".join(dict.fromkeys(packages))) if packages else ""
        text += TARGET.format(
            **fields, **paths, target=target, base_arg=base_arg, system=system,
            install_env=install_env_arg(repro, target),
            no_build_isolation=" ".join(repro.spec.env.no_build_isolation),
        )  # fmt: skip
    return text


def install_env_arg(repro: Repro, platform: str) -> str:
    """[env] install_env (and the platform's) as the INSTALL_ENV build argument."""
    if platform != "cpu" and platform not in repro.spec.platforms:
        platform = "cpu"
    return " ".join(f"{k}={v}" for k, v in repro.install_env(platform).items())


def dockerfile_path(root: Path, repro: Repro) -> Path:
    return root / "images" / repro.name / "Dockerfile"
