"""Image figures: build time cold (no layer cache) and cached, image size, and a variant's
run time on the container back end (`run --backend container`, its image built) against the
same variant on the venv back end, alternated pairs.

    .venv/bin/nox -s bench -- images [--repro lm_head --variant broken --times 3]
      [--base localhost/reprobox-base:bookworm-py3.11]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time

from common import HARNESS, ROOT, emit, summarize, timed

from reprobox.core import spec
from reprobox.run.backends import container as images


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repro", default="lm_head")
    parser.add_argument("--variant", default="broken")
    parser.add_argument("--siblings", default="avg_op,fixed", help="two variants, same lock")
    parser.add_argument("--times", type=int, default=3)
    parser.add_argument("--base", default="localhost/reprobox-base:bookworm-py3.11")
    args = parser.parse_args()
    env = {"REPROBOX_RESULTS": tempfile.mkdtemp(prefix="bench-images-")}
    extra = ["--base", args.base]
    if os.environ.get("SSL_CERT_FILE"):
        extra += ["--ca-bundle", os.environ["SSL_CERT_FILE"]]
    image_cmd = [*HARNESS, "image", args.repro, "--variant", args.variant, *extra]

    cold = timed([*image_cmd, "--no-cache"], env=env)
    engine = images.find_engine()
    repro = spec.load(ROOT, args.repro)
    tag = images.image_spec(ROOT, repro, args.variant, "cpu").tag
    # With cache: a variant that shares the lock reuses the install layer. (Layers of a
    # --no-cache build are not reused, so one sibling is built first to hold the cache.)
    holder, sibling = args.siblings.split(",")
    for name in (holder, sibling):
        tag_of = images.image_spec(ROOT, repro, name, "cpu").tag
        subprocess.run([engine.name, "rmi", "-f", tag_of], capture_output=True)
    timed([*HARNESS, "image", args.repro, "--variant", holder, *extra], env=env)
    cached = timed([*HARNESS, "image", args.repro, "--variant", sibling, *extra], env=env)
    size = subprocess.run([engine.name, "image", "inspect", "--format", "{{.Size}}", tag],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip

    run_in_venv = [*HARNESS, "run", args.repro, "--variant", args.variant]
    run_in_image = [*run_in_venv, "--backend", "container", "--base", args.base]
    timed(run_in_venv, env=env)
    timed(run_in_image, env=env)  # the back end's own tag built, if `image` made another
    pairs = [(timed(run_in_image, env=env), timed(run_in_venv, env=env)) for _ in range(args.times)]
    container, venv = summarize([c for c, _ in pairs]), summarize([v for _, v in pairs])
    emit({
        "engine": engine.name,
        "image": tag,
        "build_cold_s": round(cold, 1),
        "build_cached_s": round(cached, 1),
        "size_cpu_mb": round(int(size) / 1e6),
        "size_gpu": "not built here: no CUDA base image can be pulled",
        "run_in_container": container,
        "run_in_venv": venv,
        "container_over_venv": round(container["median_s"] / venv["median_s"], 2),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    })  # fmt: skip


if __name__ == "__main__":
    main()
