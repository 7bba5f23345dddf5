"""`reprobox bundle`: a folder and a .tar.gz a maintainer runs with no reprobox.

The unit tests check what goes in (the launcher line as a person types it, the hashed
requirements, nothing of this machine); the end-to-end test unpacks the archive into an
empty folder, installs it into a fresh venv with no reprobox, runs the bundle's own
`run.sh` and compares its exit code with the verdict `reprobox run` recorded.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from shared_runs import SharedRun

from conftest import PIP_WITHOUT_BYTECODE, newest_records, reprobox
from reprobox.core import spec
from reprobox.core.settings import Settings
from reprobox.envs.torch_source import find_links
from reprobox.envs.uv import uv_bin
from reprobox.report.bundle import TORCH_LINKS, by_hand, write_bundle

FAKE_LOCK = """\
# reprobox-lock input=0123456789abcdef
# python 3.11, platform cpu
#   torch==2.13.0
# Regenerate with: nox -s lock
numpy==1.26.4 \\
    --hash=sha256:aaaa
    # via torch
torch==2.13.0+cpu \\
    --hash=sha256:bbbb
"""


def test_launcher_lines_are_what_a_person_types(root: Path) -> None:
    lm_head = spec.load(root, "lm_head")
    assert by_hand(lm_head, "broken").line() == (
        "OMP_NUM_THREADS=1 torchrun --nproc_per_node 4 average.py --variant broken "
        "--averaging sum_div"
    )  # the harness's --start_method fork --run_path only speed up its own launches
    assert by_hand(lm_head, "fixed").line() == (
        "OMP_NUM_THREADS=1 PYTHONPATH=fixes torchrun --nproc_per_node 4 average.py "
        "--variant fixed --fix tied_average"
    )
    kl = spec.load(root, "kl")
    assert by_hand(kl, "broken").argv == [
        "accelerate", "launch", "--config_file", "zero2_bf16.yaml", "--num_processes", "2",
        "ppo_step0.py", "--variant", "broken",
    ]  # fmt: skip
    # a `python` launch of 2 ranks is spelled with torchrun, which sets RANK, WORLD_SIZE...
    seed = spec.load(root, "shuffle_seed")
    assert by_hand(seed, "broken").argv[:3] == ["torchrun", "--nproc_per_node", "2"]


def _toy(root: Path) -> spec.Repro:
    return spec.load(root, "toy")


def test_bundle_holds_what_runs_it_and_nothing_of_this_machine(
    toy_root: Path, tmp_path: Path
) -> None:
    lock = tmp_path / "toy.lock"
    lock.write_text(FAKE_LOCK)
    repro = _toy(toy_root)
    made = write_bundle(repro, ["reproduced", "fixed"], {"reproduced": lock, "fixed": lock},
                        tmp_path / "out")  # fmt: skip
    folder = made.dir
    names = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert names == [
        ".dockerignore", "Dockerfile", "README.md", "check.py", "fixes/toy_fix.py",
        "requirements/SHA256SUMS", "requirements/fixed.pins.txt", "requirements/fixed.txt",
        "requirements/reproduced.pins.txt", "requirements/reproduced.txt",
        "run.sh", "toy.py", "verdict.json",
    ]  # fmt: skip
    requirements = (folder / "requirements" / "reproduced.txt").read_text()
    assert "reprobox-lock" not in requirements and "nox -s lock" not in requirements
    assert "torch==2.13.0+cpu \\\n    --hash=sha256:bbbb" in requirements
    assert (folder / "requirements" / "fixed.pins.txt").read_text() == "torch==2.13.0\nnumpy<2\n"
    readme = (folder / "README.md").read_text()
    # one lock, one environment: both variants run in the same venv, named by what it holds
    run_sh = (folder / "run.sh").read_text()
    (env,) = re.findall(r"reproduced\|fixed\) echo ([0-9a-f]{10}) ;;", run_sh)
    assert f"export TORCH_CPU_LINKS={TORCH_LINKS}\nuv venv --python 3.11 .venv-{env}" in readme
    assert "### `reproduced`, `fixed` (one lock: one environment)" in readme
    assert "./run.sh all" in readme and "logs/VARIANT.log" in readme
    assert 'uv pip sync --require-hashes --find-links "$TORCH_CPU_LINKS" ' in readme
    assert "torchrun --nproc_per_node 2 toy.py --variant reproduced --mode reproduced" in readme
    assert "PYTHONPATH=fixes torchrun --nproc_per_node 2 toy.py --variant fixed" in readme
    assert TORCH_LINKS in readme and TORCH_LINKS in (folder / "run.sh").read_text()
    assert os.access(folder / "run.sh", os.X_OK)
    assert subprocess.run(["sh", "-n", str(folder / "run.sh")]).returncode == 0
    # nothing of this machine: no local wheel folder, checkout, home or temp path
    needles = [*find_links(Settings.from_env()), str(toy_root), str(Path.home()) + "/",
               str(tmp_path)]  # fmt: skip
    for path in folder.rglob("*"):
        if path.is_file():
            text = path.read_text()
            for needle in needles:
                assert needle not in text, f"{path.name} names {needle}"
    # the archive is the folder, under one top-level directory, and the same bytes each time
    with tarfile.open(made.archive) as tar:
        members = sorted(m.name for m in tar.getmembers() if m.isfile())
    assert members == [f"toy-bundle/{n}" for n in names]
    first = made.archive.read_bytes()
    again = write_bundle(repro, ["reproduced", "fixed"], {"reproduced": lock, "fixed": lock},
                         tmp_path / "out")  # fmt: skip
    assert again.archive.read_bytes() == first


def test_late_packages_install_after_the_rest(toy_root: Path, tmp_path: Path) -> None:
    """deepspeed-like packages (built against the environment) get their own file, and
    run.sh installs them second with --no-build-isolation."""
    toml = toy_root / "repros" / "toy" / "repro.toml"
    pins = 'pins = ["torch==2.13.0", "numpy<2"]'
    toml.write_text(toml.read_text().replace(pins, pins + '\nno_build_isolation = ["numpy"]'))
    lock = tmp_path / "toy.lock"
    lock.write_text(FAKE_LOCK)
    made = write_bundle(_toy(toy_root), ["clean"], {"clean": lock}, tmp_path / "out")
    first = (made.dir / "requirements" / "clean.txt").read_text()
    late = (made.dir / "requirements" / "clean.late.txt").read_text()
    assert "numpy" not in first and "torch==2.13.0+cpu" in first
    assert "numpy==1.26.4" in late and "torch==" not in late
    assert "--no-build-isolation" in (made.dir / "run.sh").read_text()


def test_variants_with_other_locks_get_their_own_environment(
    toy_root: Path, tmp_path: Path
) -> None:
    one, other = tmp_path / "one.lock", tmp_path / "other.lock"
    one.write_text(FAKE_LOCK)
    other.write_text(FAKE_LOCK.replace("numpy==1.26.4", "numpy==1.26.3"))
    locks = {"clean": one, "reproduced": other, "fixed": one}
    made = write_bundle(_toy(toy_root), list(locks), locks, tmp_path / "out")
    run_sh = (made.dir / "run.sh").read_text()
    envs = dict(re.findall(r"^    ([a-z|]+)\) echo ([0-9a-f]{10}) ;;$", run_sh, re.M))
    assert set(envs) == {"clean|fixed", "reproduced"}
    assert len(set(envs.values())) == 2


def _tools(tmp_path: Path, *names: str) -> str:
    """A PATH folder holding only `names` from this system (and what run.sh itself calls)."""
    folder = tmp_path / "tools"
    folder.mkdir()
    for name in ("sh", "dirname", *names):
        found = shutil.which(name)
        if found:
            (folder / name).symlink_to(found)
    return str(folder)


def test_run_sh_names_what_the_system_lacks_before_installing(
    toy_root: Path, tmp_path: Path
) -> None:
    """repro.toml's system packages (a JIT-built op's compiler) are checked first: one line
    naming the missing commands and the packages, exit 3, nothing installed."""
    toml = toy_root / "repros" / "toy" / "repro.toml"
    toml.write_text(
        toml.read_text() + '\n[image]\nsystem_packages = ["g++", "ninja-build", "python3-dev"]\n'
    )
    lock = tmp_path / "toy.lock"
    lock.write_text(FAKE_LOCK)
    made = write_bundle(_toy(toy_root), ["clean"], {"clean": lock}, tmp_path / "out")
    readme = (made.dir / "README.md").read_text()
    assert "apt-get install g++ ninja-build python3-dev" in readme
    ran = subprocess.run(["sh", str(made.dir / "run.sh"), "all"], capture_output=True, text=True,
                         env={"PATH": _tools(tmp_path, "g++")}, timeout=60)  # fmt: skip
    assert ran.returncode == 3, ran.stdout + ran.stderr
    assert ran.stderr.splitlines() == [
        "run.sh: this bundle needs g++ and ninja on PATH; missing: ninja"
        + (" g++" if not shutil.which("g++") else "")
        + " (Debian/Ubuntu: apt-get install g++ ninja-build python3-dev)"
    ]  # fmt: skip
    assert not list(made.dir.glob(".venv-*")) and not (made.dir / "logs").exists()


def test_run_sh_refuses_an_unknown_variant(toy_root: Path, tmp_path: Path) -> None:
    lock = tmp_path / "toy.lock"
    lock.write_text(FAKE_LOCK)
    made = write_bundle(_toy(toy_root), ["clean"], {"clean": lock}, tmp_path / "out")
    ran = subprocess.run(["sh", str(made.dir / "run.sh"), "nope"], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert ran.returncode == 2
    assert ran.stderr == "run.sh: unknown variant 'nope'; one of: all clean\n"


def test_an_install_that_fails_is_3_never_a_verdict(toy_root: Path, tmp_path: Path) -> None:
    """pip exits 1 when it cannot install, and 1 is "reproduced": run.sh says the install
    failed, shows its log's tail and exits 3."""
    lock = tmp_path / "toy.lock"
    lock.write_text(FAKE_LOCK)
    made = write_bundle(_toy(toy_root), ["clean"], {"clean": lock}, tmp_path / "out")
    found = shutil.which("python3.11") or shutil.which("python3")
    assert found is not None
    python = subprocess.run(
        [found, "-c", "import sys; print(sys.executable)"], capture_output=True, text=True
    ).stdout.strip()  # past any shim
    env = {"PATH": _tools(tmp_path, "tail", "head", "grep", "cut", "sed", "touch", "mkdir",
                          "sha256sum"),
           "HOME": str(tmp_path), "PYTHON": python, "TORCH_CPU_LINKS": "",
           "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_CONFIG_FILE": os.devnull,
           "PIP_RETRIES": "0", "PIP_TIMEOUT": "2"}  # fmt: skip
    ran = subprocess.run(["sh", str(made.dir / "run.sh"), "clean"], capture_output=True,
                         text=True, env=env, timeout=300)  # fmt: skip
    assert ran.returncode == 3, ran.stdout + ran.stderr
    assert re.search(r"run\.sh: installing \.venv-[0-9a-f]{10} failed\n", ran.stderr), ran.stderr
    assert "  | ERROR: " in ran.stderr  # pip's own reason, from the log's tail


def test_check_py_refuses_a_clean_result_from_a_failed_launch(
    toy_root: Path, tmp_path: Path
) -> None:
    """A rank that failed after rank 0 wrote "clean" is an error (4), as the harness's judge
    says; the accepted verdicts (also_ok) are named."""
    lock = tmp_path / "toy.lock"
    lock.write_text(FAKE_LOCK)
    made = write_bundle(_toy(toy_root), ["cannot"], {"cannot": lock}, tmp_path / "out")
    result = tmp_path / "result.json"
    result.write_text(json.dumps({"schema": 1, "verdict": "clean", "metrics": {"level": 0.0}}))
    check = [sys.executable, str(made.dir / "check.py"), "cannot", str(result)]
    ran = subprocess.run([*check, "1"], capture_output=True, text=True)
    assert ran.returncode == 4
    assert ran.stdout.startswith("error: the result says clean but the launcher exited 1")
    ran = subprocess.run([*check, "0"], capture_output=True, text=True)
    assert ran.returncode == 0
    assert "  expected for cannot: clean (or cannot_test)" in ran.stdout


def test_unknown_variant_and_foreign_folder_are_refused(toy_root: Path, tmp_path: Path) -> None:
    lock = tmp_path / "toy.lock"
    lock.write_text(FAKE_LOCK)
    with pytest.raises(spec.BadInput, match="has no variant 'nope'"):
        write_bundle(_toy(toy_root), ["nope"], {"nope": lock}, tmp_path / "out")
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "keep.md").write_text("mine")
    with pytest.raises(spec.BadInput, match="is not a reprobox bundle folder"):
        write_bundle(_toy(toy_root), ["clean"], {"clean": lock}, mine)
    assert [p.name for p in mine.iterdir()] == ["keep.md"]


def _bare_env(tmp_path: Path, with_uv: bool) -> dict[str, str]:
    """No reprobox anywhere: a PATH of system folders (and uv's, when asked for), the
    machine's torch source passed in at run time, never written into the bundle."""
    bins = [str(tmp_path / "uvbin")] if with_uv else []
    if with_uv:
        (tmp_path / "uvbin").mkdir(exist_ok=True)
        (tmp_path / "uvbin" / "uv").symlink_to(uv_bin())
    links = find_links(Settings.from_env())
    env = {
        "PATH": os.pathsep.join([*bins, "/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "TORCH_CPU_LINKS": links[0] if links else TORCH_LINKS,
    }
    for name in ("UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS", "UV_CACHE_DIR",
                 "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CERT",
                 "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE"):  # fmt: skip
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def _unpack(archive: Path, into: Path) -> Path:
    into.mkdir()
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    (folder,) = list(into.iterdir())
    return folder


@pytest.mark.e2e
def test_the_bundle_runs_without_reprobox_and_agrees_with_it(
    toy_root: Path, tmp_path: Path
) -> None:
    done = reprobox("run", "toy", "--variant", "reproduced", "--variant", "clean",
                    "--variant", "wrong")  # fmt: skip
    assert done.returncode == 1, done.stderr  # `wrong` gives reproduced where clean is expected
    verdicts = {k: v["verdict"] for k, v in newest_records(toy_root / "results", "toy").items()}
    assert verdicts == {"reproduced": "reproduced", "clean": "clean", "wrong": "reproduced"}

    made = reprobox("bundle", "toy", "--variant", "reproduced", "--variant", "clean",
                    "--variant", "wrong", "-o", str(tmp_path / "bundle"))  # fmt: skip
    assert made.returncode == 0, made.stderr
    folder = _unpack(tmp_path / "bundle" / "toy-bundle.tar.gz", tmp_path / "unpacked")
    env = _bare_env(tmp_path, with_uv=True)
    codes = {"reproduced": 1, "clean": 0}
    for variant, verdict in verdicts.items():
        ran = subprocess.run(["sh", "run.sh", variant], cwd=folder, env=env, capture_output=True,
                             text=True, timeout=600)  # fmt: skip
        assert ran.returncode == codes[verdict], ran.stdout + ran.stderr
        assert f"{verdict}: level = " in ran.stdout, ran.stdout
    # `all` holds each verdict against the expected one: `wrong` makes it exit 1, said so
    ran = subprocess.run(["sh", "run.sh", "all"], cwd=folder, env=env, capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    assert ran.returncode == 1, ran.stdout + ran.stderr
    table = _table(ran.stdout)
    assert table == {"reproduced": ["reproduced", "reproduced", "ok"],
                     "clean": ["clean", "clean", "ok"],
                     "wrong": ["clean", "reproduced", "UNEXPECTED"]}  # fmt: skip
    assert len(list(folder.glob(".venv-*"))) == 1  # three variants, one lock
    venv = next(folder.glob(".venv-*"))
    listed = subprocess.run([str(venv / "bin" / "python"), "-c",
                             "import importlib.util as u; print(u.find_spec('reprobox'))"],
                            capture_output=True, text=True, env=env)  # fmt: skip
    assert listed.stdout.strip() == "None"  # really without the harness


def _table(stdout: str) -> dict[str, list[str]]:
    """run.sh all's closing table: variant -> [expected, verdict, mark]."""
    lines = stdout.splitlines()
    head = ["variant", "expected", "verdict"]
    start = next(i for i, line in enumerate(lines) if line.split()[:3] == head)
    rows = {}
    for line in lines[start + 1 :]:
        if line.startswith("run.sh:"):
            break
        variant, *rest = line.split()
        rows[variant] = rest
    return rows


@pytest.mark.e2e
def test_lm_head_bundle_runs_all_in_one_line_from_the_tarball(root: Path, tmp_path: Path) -> None:
    """What a maintainer does with the attachment: untar it into an empty folder, run
    `./run.sh all` with no reprobox anywhere. Every variant gives its expected verdict; the
    torchrun traceback of a script exiting 1 (reproduced) stays in the log; the four
    variants share their one lock's environment. A variant whose script then fails shows
    its log's tail and exits 4."""
    made = reprobox("bundle", "lm_head", "-o", str(tmp_path / "bundle"))
    assert made.returncode == 0, made.stderr
    folder = _unpack(tmp_path / "bundle" / "lm_head-bundle.tar.gz", tmp_path / "unpacked")
    env = _bare_env(tmp_path, with_uv=True)
    ran = subprocess.run(["./run.sh", "all"], cwd=folder, env=env, capture_output=True,
                         text=True, timeout=900)  # fmt: skip
    out = ran.stdout + ran.stderr
    assert ran.returncode == 0, out
    assert _table(ran.stdout) == {
        "broken": ["reproduced", "reproduced", "ok"],
        "fixed": ["clean", "clean", "ok"],
        "avg_op": ["clean/cannot_test", "clean", "ok"],
        "untied": ["clean", "clean", "ok"],
    }  # fmt: skip
    assert "ChildFailedError" not in out and "Traceback" not in out and "FAILED" not in out
    assert "ChildFailedError" in (folder / "logs" / "broken.log").read_text()
    requirements = {(folder / "requirements" / f"{v}.txt").read_text().split("\n", 1)[1]
                    for v in ("broken", "fixed", "avg_op", "untied")}  # fmt: skip
    assert len(list(folder.glob(".venv-*"))) == len(requirements) == 1

    script = folder / "average.py"
    future = "from __future__ import annotations\n"
    planted = "import sys\nif 'fixed' in sys.argv:\n    raise RuntimeError('planted failure')\n"
    script.write_text(script.read_text().replace(future, future + planted, 1))
    ran = subprocess.run(["./run.sh", "fixed"], cwd=folder, env=env, capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    assert ran.returncode == 4, ran.stdout + ran.stderr
    assert ran.stdout.startswith("error: no readable result"), ran.stdout
    assert "run.sh: the last lines of logs/fixed.log before torchrun's summary" in ran.stderr
    assert "  | RuntimeError: planted failure" in ran.stderr


@pytest.mark.e2e
@pytest.mark.slow
def test_the_bundle_runs_with_pip_where_uv_is_absent(toy_root: Path, tmp_path: Path) -> None:
    made = reprobox("bundle", "toy", "--variant", "clean", "-o", str(tmp_path / "bundle"))
    assert made.returncode == 0, made.stderr
    folder = _unpack(tmp_path / "bundle" / "toy-bundle.tar.gz", tmp_path / "unpacked")
    env = _bare_env(tmp_path, with_uv=False) | PIP_WITHOUT_BYTECODE
    python = shutil.which("python3.11") or shutil.which("python3")
    assert python is not None
    env["PYTHON"] = python
    ran = subprocess.run(["sh", "run.sh", "clean"], cwd=folder, env=env, capture_output=True,
                         text=True, timeout=900)  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    (venv,) = folder.glob(".venv-*")
    assert (venv / "bin" / "pip").exists()  # the pip path, not uv's


SECRET_NAMED = """
[variants.secret_leak]
expect = "reproduced"
args = ["--mode", "reproduced"]
default = false
"""


def test_a_bundle_never_redacts_its_own_expectations(toy_root: Path, tmp_path: Path) -> None:
    """A variant whose name holds "secret": its expected verdict stays in verdict.json, and
    check.py names it (it was "[REDACTED]": issue 35); a real secret in the bundle is still
    replaced."""
    toy = toy_root / "repros" / "toy"
    (toy / "repro.toml").write_text((toy / "repro.toml").read_text() + SECRET_NAMED)
    lock = tmp_path / "toy.lock"
    lock.write_text(FAKE_LOCK)
    (toy / "notes.txt").write_text("HF_TOKEN=hf_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3" + "\n")
    made = write_bundle(_toy(toy_root), ["secret_leak"], {"secret_leak": lock}, tmp_path / "out")
    verdicts = json.loads((made.dir / "verdict.json").read_text())
    assert verdicts["expect"] == {"secret_leak": "reproduced"}, verdicts
    assert "verdict.json" not in made.scrubbed and "notes.txt" in made.scrubbed
    assert "hf_a1B2" not in (made.dir / "notes.txt").read_text()
    result = tmp_path / "result.json"
    result.write_text(json.dumps({"schema": 1, "verdict": "reproduced", "metrics": {"level": 1.0}}))
    check = [sys.executable, str(made.dir / "check.py"), "secret_leak", str(result), "1"]
    ran = subprocess.run(check, capture_output=True, text=True)
    assert ran.returncode == 1, ran.stdout + ran.stderr  # reproduced, as bisect reads it
    assert "  expected for secret_leak: reproduced" in ran.stdout, ran.stdout


def test_run_sh_checks_the_lock_on_every_run(toy_root: Path, tmp_path: Path) -> None:
    """A lock edited after the bundle was made (before its install, or after it: the old
    environment would run, exit 0) is an error, exit 6, and under `git bisect run` a stop
    (255), never a skip (issue 35). Nothing is installed: the check comes first."""
    lock = tmp_path / "toy.lock"
    lock.write_text(FAKE_LOCK)
    made = write_bundle(_toy(toy_root), ["clean"], {"clean": lock}, tmp_path / "out")
    sums = (made.dir / "requirements" / "SHA256SUMS").read_text()
    assert re.fullmatch(r"[0-9a-f]{64}  requirements/clean\.txt\n", sums), sums
    req = made.dir / "requirements" / "clean.txt"
    req.write_text(req.read_text().replace("numpy==1.26.4", "numpy==1.26.3"))

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(["sh", str(made.dir / "run.sh"), "clean"], capture_output=True,
                              text=True, timeout=60)  # fmt: skip

    said = "run.sh: requirements/clean.txt is not the lock this bundle was made with"
    ran = run()
    assert ran.returncode == 6 and said in ran.stderr, ran.stdout + ran.stderr
    assert "installing" not in ran.stdout  # checked first: nothing was installed
    # as if installed from the lock before the edit: the old environment never runs
    env_id = re.search(r"clean\) echo ([0-9a-f]{10})", (made.dir / "run.sh").read_text())
    assert env_id is not None
    installed = made.dir / f".venv-{env_id.group(1)}"
    (installed / "bin").mkdir(parents=True)
    (installed / ".installed").touch()
    ran = run()
    assert ran.returncode == 6 and said in ran.stderr, ran.stdout + ran.stderr
    verdict = subprocess.run(["sh", str(made.dir / "run.sh"), "verdict", "clean"],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert verdict.returncode == 255, verdict.stderr


def test_a_download_that_does_not_match_the_lock_is_6_never_a_skip(
    toy_root: Path, tmp_path: Path
) -> None:
    """pip refuses a wheel whose hash is not the lock's: run.sh says so and exits 6 (it was
    3, which `run.sh verdict` answers 125, skip: issue 35), and `verdict` stops git (255)."""
    from test_repeats_e2e import _wheel

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels)
    lock = tmp_path / "toy.lock"
    lock.write_text("reprobox-coin==0.1.0 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    made = write_bundle(_toy(toy_root), ["clean"], {"clean": lock}, tmp_path / "out")
    found = shutil.which("python3.11") or shutil.which("python3")
    assert found is not None
    python = subprocess.run(
        [found, "-c", "import sys; print(sys.executable)"], capture_output=True, text=True
    ).stdout.strip()  # past any shim
    env = {"PATH": _tools(tmp_path, "tail", "head", "grep", "cut", "sed", "touch", "mkdir",
                          "sha256sum"),
           "HOME": str(tmp_path), "PYTHON": python, "TORCH_CPU_LINKS": "",
           "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels), "PIP_CONFIG_FILE": os.devnull,
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}  # fmt: skip
    ran = subprocess.run(["sh", str(made.dir / "run.sh"), "clean"], capture_output=True,
                         text=True, env=env, timeout=300)  # fmt: skip
    assert ran.returncode == 6, ran.stdout + ran.stderr
    assert "run.sh: a download does not match the lock's hash: an error, not a skip" in (ran.stderr)
    verdict = subprocess.run(["sh", str(made.dir / "run.sh"), "verdict", "clean"],
                             capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert verdict.returncode == 255, verdict.stderr


# Where an index or a proxy would be, if anything tried one: nothing listens on port 9.
CUT_OFF = "http://127.0.0.1:9"


@pytest.mark.e2e
@pytest.mark.parametrize(
    # kl's also builds DeepSpeed from its sdist and runs three DeepSpeed launches: nightly
    "name",
    ["lm_head", pytest.param("kl", marks=[pytest.mark.slow, pytest.mark.nightly])],
)
def test_a_repro_rebuilds_from_its_wheelhouse_with_the_index_cut_off(
    name: str, root: Path, tmp_path: Path, default_runs: Callable[[str], SharedRun]
) -> None:
    """Durability: `bundle --wheelhouse DIR` carries every file the repro's locks install
    (DIR filled with them first; what else DIR holds stays out), and the
    untarred bundle rebuilds the environments from the locks with no index (uv's cache
    empty, every index and proxy pointed at a port nothing answers, the machine's
    find-links gone) and gives the verdicts `reprobox run` recorded."""
    recorded = default_runs(name)
    assert recorded.returncode == 0, recorded.stderr
    verdicts = {k: r["verdict"] for k, r in newest_records(recorded.results, name).items()}
    house = tmp_path / "house"
    house.mkdir()
    (house / "reprobox_unpinned-0.1.0-py3-none-any.whl").write_bytes(b"not pinned: never carried")
    made = reprobox("bundle", name, "--wheelhouse", str(house), "-o",
                    str(tmp_path / "bundle"), timeout=1800)  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert "bundle: wheelhouse/ holds " in made.stderr, made.stderr
    folder = _unpack(tmp_path / "bundle" / f"{name}-bundle.tar.gz", tmp_path / "unpacked")
    carried = {p.name for p in (folder / "wheelhouse").iterdir()}
    assert any(name.startswith("torch-") for name in carried)
    assert "reprobox_unpinned-0.1.0-py3-none-any.whl" not in carried
    env = {k: v for k, v in _bare_env(tmp_path, with_uv=True).items()
           if not k.startswith(("UV_", "PIP_"))}  # fmt: skip
    env.update({
        "UV_INDEX_URL": f"{CUT_OFF}/simple", "PIP_INDEX_URL": f"{CUT_OFF}/simple",
        "HTTP_PROXY": CUT_OFF, "HTTPS_PROXY": CUT_OFF, "http_proxy": CUT_OFF,
        "https_proxy": CUT_OFF, "TORCH_CPU_LINKS": "", "UV_CACHE_DIR": str(tmp_path / "uv"),
        "PIP_CONFIG_FILE": os.devnull,
    })  # fmt: skip
    ran = subprocess.run(["./run.sh", "all"], cwd=folder, env=env, capture_output=True,
                         text=True, timeout=2400)  # fmt: skip
    out = ran.stdout + ran.stderr
    assert ran.returncode == 0, (
        out
        + (folder / "logs")
        .joinpath(next(p.name for p in (folder / "logs").glob("install-*.log")))
        .read_text()[-3000:]
    )
    table = _table(ran.stdout)
    assert {variant: row[1] for variant, row in table.items()} == verdicts
