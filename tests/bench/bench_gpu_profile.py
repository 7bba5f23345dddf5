"""kl's GPU profile installs, and its CPU path runs in it to the expected verdicts.

PyPI's CUDA builds of torch import and run on a CPU-only host, so the GPU locks
(repros/kl/locks/<variant>.gpu.txt) can be proved here: each is installed into its venv
exactly as a GPU host would (the GPU profile's python and install env, DeepSpeed built last
without isolation), then the kl script runs under `accelerate launch` with
`DS_ACCELERATOR=cpu`, and its verdict is compared with the variant's `expect`. Not part of
`make test`: the first run downloads about 3 GB of CUDA wheels.

    .venv/bin/nox -s bench -- gpu_profile [--variants broken fixed zero2_bf16_1gpu fixed_1gpu]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, emit

from reprobox.core.settings import Settings, repro_cache
from reprobox.core.spec import load
from reprobox.envs import venvs
from reprobox.envs.locks import check_body
from reprobox.run.pipeline import env_inputs


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variants", nargs="+", default=["broken", "fixed"])
    variants = parser.parse_args().variants
    settings = Settings.from_env()
    repro = load(ROOT, "kl")
    figures: dict[str, object] = {"platform": "gpu", "python": repro.python("gpu")}
    failed = False
    for variant in variants:
        lock = repro.dir / "locks" / f"{variant}.gpu.txt"
        launch = repro.launch(variant)  # the 1-GPU variants run one process
        check_body(lock)
        started = time.perf_counter()
        env = venvs.ensure_env(lock, *env_inputs(repro, "gpu"), settings=settings)
        install_s = time.perf_counter() - started
        # torch's version, CUDA, the archs compiled in (sm_90 for H100/H200), a GPU here
        torch_line = subprocess.run(
            [str(env.bin("python")), "-c",
             "import torch; print(torch.__version__, torch.version.cuda, "
             "torch._C._cuda_getArchFlags(), torch.cuda.is_available())"],
            capture_output=True, text=True, check=False,
        ).stdout.strip()  # fmt: skip
        out = Path(tempfile.mkdtemp(prefix=f"bench-gpu-profile-{variant}-"))
        result = out / "result.json"
        cmd = [
            str(env.bin("accelerate")), "launch",
            "--config_file", str(repro.dir / (launch.config or "")),
            "--num_processes", str(launch.processes), "--main_process_port", str(_port()),
            str(repro.script), "--variant", variant, *repro.variant(variant).args,
        ]  # fmt: skip
        run_env = {
            **os.environ,
            **launch.env,
            "DS_ACCELERATOR": "cpu",
            "REPRO_RESULT": str(result),
            "REPRO_CACHE": str(repro_cache(settings, "kl")),
            "PATH": os.pathsep.join([str(env.path / "bin"), os.environ.get("PATH", "")]),
            "VIRTUAL_ENV": str(env.path),
        }
        started = time.perf_counter()
        proc = subprocess.run(cmd, env=run_env, cwd=out, capture_output=True, text=True,
                              timeout=launch.timeout, check=False)  # fmt: skip
        run_s = time.perf_counter() - started
        (out / "launch.log").write_text(proc.stdout + proc.stderr)
        verdict = json.loads(result.read_text())["verdict"] if result.is_file() else None
        metrics = json.loads(result.read_text())["metrics"] if result.is_file() else {}
        expected = repro.variant(variant).expect
        ok = verdict == expected or (expected == "unknown" and verdict is not None)
        failed |= not ok
        figures[variant] = {
            "install_s": round(install_s, 1),
            "env_created": env.created,
            "torch": torch_line,
            "run_s": round(run_s, 1),
            "exit": proc.returncode,
            "verdict": verdict,
            "expected": expected,
            "ok": ok,
            "metrics": metrics,
            "log": str(out / "launch.log"),
        }
    emit(figures)
    if failed:
        sys.exit("a GPU-profile variant did not give its expected verdict (see the logs above)")


if __name__ == "__main__":
    main()
