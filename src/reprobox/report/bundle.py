"""A folder (and a .tar.gz of it) that reproduces a bug with no reprobox.

A maintainer runs what is attached to the issue, not a harness checkout. The bundle holds
the script and what it reads (configs, helper modules), the fix modules its variants use,
per variant the hashed requirements of its lock and the short list of top-level pins, a
README with the exact commands (`uv venv`, `uv pip sync`, then the launcher line as a person
types it), a `run.sh` doing exactly that (with `python3 -m venv` + pip where uv is absent)
and exiting with the verdict code, its `check.py` (the verdict rule of repro.toml, stdlib
only), and a Dockerfile around `run.sh`.

Nothing machine-specific goes in: where torch's CPU build comes from is read at run time
(`TORCH_CPU_LINKS`, default the PyTorch CPU index's torch page; `UV_FIND_LINKS` /
`PIP_FIND_LINKS` work too).
"""

from __future__ import annotations

import gzip
import io
import json
import shlex
import shutil
import tarfile
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from reprobox.core import spec
from reprobox.core.cells import make_cell, script_args
from reprobox.core.errors import BadInput
from reprobox.envs.torch_source import PYTORCH_CPU_INDEX, pinned_torch
from reprobox.envs.venvs import split_lock

BUNDLE_DIR = "_bundle"
MARKER = ".reprobox-bundle"  # marks a folder this module wrote (and may replace)
TORCH_LINKS = f"{PYTORCH_CPU_INDEX}/torch/"  # a flat page of the CPU wheels: a find-links
# torchrun options that only change how ranks start (the harness's speed-ups), not what
# they compute: a person's line leaves them out.
_STARTUP_ONLY = {"--start_method": 1, "--start-method": 1, "--run_path": 0, "--run-path": 0}
_FILES = (".py", ".yaml", ".yml", ".json", ".cfg", ".txt")
VERDICT_CODES = {"clean": 0, "reproduced": 1, "cannot_test": 125}


class BundleError(BadInput):
    """The bundle cannot be written (unknown variant, foreign folder, missing lock)."""


@dataclass(frozen=True)
class ByHand:
    """A launch as a person types it: variables to set, then the command."""

    env: dict[str, str]
    argv: list[str]

    def line(self) -> str:
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return f"{prefix} {shlex.join(self.argv)}".strip()


def by_hand(
    repro: spec.Repro,
    variant: str,
    params: Mapping[str, str] | None = None,
    fixes: str = "fixes",
) -> ByHand:
    """The plain launcher line of a variant, run from a folder holding the script (and
    `fixes/`): `torchrun --nproc_per_node 4 average.py --variant broken --averaging sum_div`.

    A `python` launch of several processes is spelled with torchrun, which gives each rank
    the same environment the harness does (RANK, WORLD_SIZE, MASTER_ADDR, ...)."""
    launch = repro.launch(variant)
    args = script_args(repro, make_cell(repro, variant, params=params))
    script = repro.spec.repro.script
    env = dict(launch.env)
    if repro.variant(variant).fix:
        env["PYTHONPATH"] = fixes
    extra = _person_args(list(launch.args)) if launch.launcher == "torchrun" else list(launch.args)
    if launch.launcher == "accelerate":
        config = ["--config_file", launch.config] if launch.config else []
        argv = ["accelerate", "launch", *config, "--num_processes", str(launch.processes)]
        return ByHand(env, [*argv, *extra, script, *args])
    if launch.launcher == "torchrun" or launch.processes > 1:
        nproc = ["--nproc_per_node", str(launch.processes)]
        torchrun_extra = extra if launch.launcher == "torchrun" else []
        return ByHand(env, ["torchrun", *nproc, *torchrun_extra, script, *args])
    return ByHand(env, ["python", *extra, script, *args])


def _person_args(args: list[str]) -> list[str]:
    kept: list[str] = []
    skip = 0
    for arg in args:
        if skip:
            skip -= 1
            continue
        name = arg.split("=", 1)[0]
        if name in _STARTUP_ONLY:
            skip = 0 if "=" in arg else _STARTUP_ONLY[name]
            continue
        kept.append(arg)
    return kept


def top_pins(repro: spec.Repro, variant: str, platform: str = "cpu") -> list[str]:
    """The requirements repro.toml names for a variant (what `pip install` gets)."""
    return repro.requirements(variant, platform)


def pip_line(pins: Sequence[str]) -> str:
    return "pip install " + " ".join(shlex.quote(p) for p in pins)


@dataclass(frozen=True)
class Bundle:
    dir: Path  # the folder
    archive: Path  # the .tar.gz of it
    variants: list[str]


def default_out(results: Path, name: str) -> Path:
    return results / name / BUNDLE_DIR


def _requirements(lock_text: str, source: str, late: Sequence[str]) -> tuple[str, str]:
    """The lock without its harness header, split into what installs first and the packages
    built against the environment afterwards (deepspeed's setup imports torch)."""
    body = lock_text.splitlines(keepends=True)
    while body and body[0].startswith("#"):
        body.pop(0)
    header = f"# Hashed requirements from {source}\n"
    first, second = split_lock("".join(body), late)
    return header + first.lstrip("\n"), (header + second.lstrip("\n")) if second.strip() else ""


def _copy_sources(repro: spec.Repro, dest: Path, variants: Sequence[str]) -> list[str]:
    """The repro's own files (script, configs, helpers) and the fixes its variants use."""
    copied = []
    for path in sorted(repro.dir.iterdir()):
        if path.is_file() and not path.is_symlink() and path.suffix in _FILES:
            shutil.copy2(path, dest / path.name)
            copied.append(path.name)
    fixes = sorted({f for v in variants if (f := repro.variant(v).fix)})
    for fix in fixes:
        source = repro.fixes_dir / f"{fix}.py"
        if not source.is_file():
            raise BundleError(f"variant fix {fix!r}: {source} is missing")
        (dest / "fixes").mkdir(exist_ok=True)
        shutil.copy2(source, dest / "fixes" / source.name)
        copied.append(f"fixes/{source.name}")
    return copied


def _verdict_json(repro: spec.Repro, variants: Sequence[str]) -> str:
    rules = {v: [{"metric": r.metric, "above": r.above} for r in repro.rules(v)] for v in variants}
    expect = {v: repro.variant(v).expect.value for v in variants}
    return json.dumps({"repro": repro.name, "rules": rules, "expect": expect}, indent=2) + "\n"


CHECK_PY = '''\
"""Read the result a run wrote and exit with its verdict code: 0 clean, 1 reproduced,
125 cannot test here, 4 error (no result, or a verdict its own metrics contradict).

The verdict rule is repro.toml's (in verdict.json): a metric decides, not a log line.
Usage: python check.py VARIANT RESULT.json LAUNCHER_EXIT_STATUS
"""

import json
import sys
from pathlib import Path

CODES = {"clean": 0, "reproduced": 1, "cannot_test": 125}


def main(variant, result_path, launcher_status):
    spec = json.loads((Path(__file__).parent / "verdict.json").read_text())
    rules, expect = spec["rules"][variant], spec["expect"][variant]
    try:
        result = json.loads(Path(result_path).read_text())
        said, metrics = result["verdict"], result.get("metrics", {})
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"error: no readable result ({exc}); the launcher exited {launcher_status}")
        return 4
    if said == "cannot_test":
        print(f"cannot_test: {result.get('reason', '')}")
        return 125
    shown = []
    hit = False
    for rule in rules:
        value = metrics.get(rule["metric"])
        if not isinstance(value, (int, float)):
            print(f"error: the result has no metric {rule['metric']!r}")
            return 4
        hit = hit or value > rule["above"]
        shown.append(f"{rule['metric']} = {value:.4g} (reproduced above {rule['above']:g})")
    verdict = "reproduced" if hit else "clean"
    if said != verdict:
        print(f"error: the script said {said!r}, its metrics say {verdict!r}: " + "; ".join(shown))
        return 4
    print(f"{verdict}: " + "; ".join(shown))
    if result.get("reason"):
        print(f"  {result['reason']}")
    print(f"  expected for {variant}: {expect}")
    return CODES[verdict]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "?"))
'''


def _run_sh(
    repro: spec.Repro,
    variants: Sequence[str],
    lines: Mapping[str, ByHand],
    late: Mapping[str, bool],
    cpu_torch: Mapping[str, bool],
    python: str,
    install_env: Mapping[str, str],
) -> str:
    """run.sh: what the README says, in POSIX sh."""
    names = " ".join(variants)
    cases = "\n".join(
        f'  {v}) REPRO_RESULT="$PWD/result-{v}.json" {lines[v].line()} || status=$? ;;'
        for v in variants
    )
    lates = " ".join(v for v in variants if late[v]) or "-"
    cpus = " ".join(v for v in variants if cpu_torch[v]) or "-"
    exports = "".join(f"export {k}={shlex.quote(val)}\n" for k, val in install_env.items())
    return f"""\
#!/bin/sh
# {repro.name}: {repro.spec.repro.title}
# Runs one variant with no reprobox: a venv beside this file (uv, else python3 -m venv + pip),
# the hashed requirements of the variant's lock, then its launcher line (see README.md).
# Exits with the verdict code: 0 clean, 1 reproduced, 125 cannot test here, 4 error.
#
# Usage: ./run.sh [--install-only] [VARIANT]      variants: {names}
# Env:   TORCH_CPU_LINKS  where torch's CPU build (torch==X+cpu) is found: a URL or a folder of
#                         wheels (default {TORCH_LINKS}); empty: only what
#                         UV_FIND_LINKS / PIP_FIND_LINKS / your index configuration give
#        PYTHON           the interpreter for the pip path (default python3; needs {python})
set -eu
cd "$(dirname "$0")"
install_only=
if [ "${{1:-}}" = --install-only ]; then install_only=1; shift; fi
variant=${{1:-{variants[0]}}}
case " {names} " in
  *" $variant "*) ;;
  *) echo "run.sh: unknown variant '$variant'; one of: {names}" >&2; exit 2 ;;
esac
venv=.venv-$variant
links=${{TORCH_CPU_LINKS-{TORCH_LINKS}}}
set --
case " {cpus} " in *" $variant "*) [ -n "$links" ] && set -- --find-links "$links" ;; esac
late=
case " {lates} " in *" $variant "*) late=requirements/$variant.late.txt ;; esac
{exports}
if command -v uv >/dev/null 2>&1; then
  [ -x "$venv/bin/python" ] || uv venv --quiet --python {python} "$venv"
  uv pip sync --quiet --require-hashes --python "$venv/bin/python" "$@" "requirements/$variant.txt"
  if [ -n "$late" ]; then
    uv pip install --quiet --require-hashes --no-deps --no-build-isolation \\
      --python "$venv/bin/python" "$@" -r "$late"
  fi
else
  py=${{PYTHON:-python3}}
  if ! "$py" -c 'import sys; sys.exit(sys.version_info[:2] != ({python.replace(".", ", ")}))'; then
    echo "run.sh: no uv, and $py is not python {python} (the lock's): install uv or set PYTHON" >&2
    exit 3
  fi
  [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --require-hashes --no-deps "$@" \\
    -r "requirements/$variant.txt"
  if [ -n "$late" ]; then
    "$venv/bin/python" -m pip install --quiet --require-hashes --no-deps --no-build-isolation \\
      "$@" -r "$late"
  fi
fi
[ -z "$install_only" ] || exit 0

PATH="$PWD/$venv/bin:$PATH"
export PATH VIRTUAL_ENV="$PWD/$venv"
rm -f "result-$variant.json"
status=0
case $variant in
{cases}
esac
exec "$venv/bin/python" check.py "$variant" "result-$variant.json" "$status"
"""


def _dockerfile(repro: spec.Repro, variants: Sequence[str]) -> str:
    image = repro.spec.image
    apt = ""
    if image.system_packages:
        packages = " ".join(image.system_packages)
        apt = (
            "RUN apt-get update \\\n && DEBIAN_FRONTEND=noninteractive apt-get install -y "
            f"--no-install-recommends {packages} \\\n && rm -rf /var/lib/apt/lists/*\n"
        )
    return f"""\
# {repro.name}: {repro.spec.repro.title}
# The bundle in a container, with no reprobox. From this folder:
#   docker build -t {repro.name}-repro --build-arg VARIANT={variants[0]} .
#   docker run --rm {repro.name}-repro            # exits with the verdict code
FROM {image.base}
{apt}RUN useradd --create-home --uid 10001 repro
WORKDIR /bundle
COPY --chown=10001:10001 . /bundle
USER 10001
ARG VARIANT={variants[0]}
ARG TORCH_CPU_LINKS={TORCH_LINKS}
ENV VARIANT=$VARIANT
RUN TORCH_CPU_LINKS=$TORCH_CPU_LINKS ./run.sh --install-only "$VARIANT"
CMD ["/bin/sh", "-c", "exec ./run.sh \\"$VARIANT\\""]
"""


def _readme(
    repro: spec.Repro,
    variants: Sequence[str],
    lines: Mapping[str, ByHand],
    late: Mapping[str, bool],
    cpu_torch: Mapping[str, bool],
    python: str,
    install_env: Mapping[str, str],
    platform: str,
    files: Sequence[str],
) -> str:
    s = repro.spec.repro
    rules = repro.spec.verdict.reproduced_if
    rule = " or ".join(f"`{r.metric}` > {r.above:g}" for r in rules)
    out = [
        f"# {s.title}",
        "",
        f"Upstream: {s.upstream}",
        "",
        "A self-contained reproduction: no reprobox needed. Every variant runs the same script; "
        f"it is **reproduced** when {rule} (the metric is computed by the script and printed "
        "at the end), **clean** otherwise.",
        "",
    ]
    if s.expected:
        out += ["## Expected behavior", "", s.expected.strip(), ""]
    out += ["## Variants", ""]
    for v in variants:
        desc = repro.variant(v).description
        out.append(
            f"- `{v}` (expected **{repro.variant(v).expect.value}**)"
            + (f": {desc}" if desc else "")
        )
    out += [
        "",
        "## Run it",
        "",
        "`./run.sh VARIANT` does all of the below (a venv beside this file with uv, or with "
        "`python3 -m venv` + pip when uv is absent) and exits with the verdict code: 0 clean, "
        "1 reproduced, 125 cannot test here, 4 error.",
        "",
    ]
    env_line = " ".join(f"{k}={shlex.quote(v)}" for k, v in install_env.items())
    for v in variants:
        links = ' --find-links "$TORCH_CPU_LINKS"' if cpu_torch[v] else ""
        steps = [f"export TORCH_CPU_LINKS={TORCH_LINKS}"] if cpu_torch[v] else []
        steps += [f"uv venv --python {python} .venv-{v}", f". .venv-{v}/bin/activate"]
        sync = f"uv pip sync --require-hashes{links} requirements/{v}.txt"
        steps.append(f"{env_line} {sync}".strip())
        if late[v]:
            steps.append(
                f"{env_line} uv pip install --require-hashes --no-deps --no-build-isolation"
                f"{links} -r requirements/{v}.late.txt".strip()
            )
        steps.append(lines[v].line())
        out += [f"### `{v}`", "", "```sh", *steps, "```", ""]
    if any(cpu_torch.values()):
        out += [
            f"The requirements pin torch's CPU build (`+cpu`), which PyPI does not serve: set "
            f"`TORCH_CPU_LINKS={TORCH_LINKS}` (the PyTorch CPU index's torch page, what "
            f"`run.sh` uses by default) or a folder holding the wheel. `UV_FIND_LINKS` / "
            f"`PIP_FIND_LINKS` work as well.",
            "",
        ]
    pins = {v: top_pins(repro, v, platform) for v in variants}
    out += [
        "Without the hashes, the top-level pins of each variant (`requirements/VARIANT.pins.txt`):",
        "",
        "```sh",
        *(f"{pip_line(pins[v])}    # {v}" for v in variants),
        "```",
        "",
        "With `REPRO_RESULT=result.json` set, rank 0 writes its result (verdict, metrics, "
        "versions) there; `python check.py VARIANT result.json` reads it back and exits with "
        "the verdict code.",
        "",
        "## In a container",
        "",
        "```sh",
        f"docker build -t {repro.name}-repro --build-arg VARIANT={variants[0]} .",
        f"docker run --rm {repro.name}-repro",
        "```",
        "",
        "## Files",
        "",
        *(f"- `{f}`" for f in files),
        "- `requirements/`: per variant the hashed lock (`VARIANT.txt`"
        + (", and `VARIANT.late.txt`, built against it" if any(late.values()) else "")
        + ") and the top-level pins (`VARIANT.pins.txt`)",
        "- `run.sh`, `check.py` (the verdict rule, `verdict.json`), `Dockerfile`",
        "",
    ]
    return "\n".join(out)


def write_bundle(
    repro: spec.Repro,
    variants: Sequence[str],
    locks: Mapping[str, Path],
    out: Path,
    platform: str = "cpu",
    lock_names: Mapping[str, str] | None = None,
) -> Bundle:
    """Write `out/<repro>-bundle/` and `out/<repro>-bundle.tar.gz` for `variants`, each
    installed from its lock in `locks` (the committed one, where there is one; the caller
    resolves them). A failure leaves any earlier bundle in `out` as it was."""
    if not variants:
        raise BundleError(f"no variants to bundle for {repro.name}")
    for v in variants:
        repro.variant(v)  # unknown variants: BadInput naming the known ones
        if v not in locks:
            raise BundleError(f"no lock for variant {v!r}")
    name = f"{repro.name}-bundle"
    out = out.absolute()
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / MARKER).exists())):
        raise BundleError(f"{out} exists and is not a reprobox bundle folder; choose another -o")
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f"_tmp-{uuid.uuid4().hex[:8]}"
    folder = tmp / name
    try:
        (folder / "requirements").mkdir(parents=True)
        files = _copy_sources(repro, folder, variants)
        late_pkgs = repro.spec.env.no_build_isolation
        late: dict[str, bool] = {}
        cpu_torch: dict[str, bool] = {}
        for v in variants:
            text = locks[v].read_text()
            torch = pinned_torch(text)
            cpu_torch[v] = torch is not None and torch.local is not None
            source = (lock_names or {}).get(v, f"the {v} lock")
            first, second = _requirements(text, source, late_pkgs)
            (folder / "requirements" / f"{v}.txt").write_text(first)
            if second:
                (folder / "requirements" / f"{v}.late.txt").write_text(second)
            late[v] = bool(second)
            pins = "\n".join(top_pins(repro, v, platform)) + "\n"
            (folder / "requirements" / f"{v}.pins.txt").write_text(pins)
        lines = {v: by_hand(repro, v) for v in variants}
        python = repro.python(platform)
        install_env = repro.install_env(platform)
        (folder / "verdict.json").write_text(_verdict_json(repro, variants))
        (folder / "check.py").write_text(CHECK_PY)
        run_sh = folder / "run.sh"
        run_sh.write_text(_run_sh(repro, variants, lines, late, cpu_torch, python, install_env))
        run_sh.chmod(0o755)
        (folder / "Dockerfile").write_text(_dockerfile(repro, variants))
        (folder / ".dockerignore").write_text(".venv-*\nresult-*.json\n")
        readme = _readme(
            repro, variants, lines, late, cpu_torch, python, install_env, platform, files
        )
        (folder / "README.md").write_text(readme)
        archive = tmp / f"{name}.tar.gz"
        _tar(folder, archive)
        for old in (out / name, out / f"{name}.tar.gz"):
            if old.is_dir():
                shutil.rmtree(old)
            elif old.exists():
                old.unlink()
        folder.rename(out / name)
        archive.rename(out / f"{name}.tar.gz")
        (out / MARKER).write_text("written by reprobox bundle; replaced by the next one\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Bundle(out / name, out / f"{name}.tar.gz", list(variants))


def _tar(folder: Path, archive: Path) -> None:
    """A reproducible archive: sorted names, no owners, no timestamps."""

    def clean(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        return info

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in [folder, *sorted(folder.rglob("*"))]:
            tar.add(path, arcname=path.relative_to(folder.parent).as_posix(), recursive=False,
                    filter=clean)  # fmt: skip
    with gzip.GzipFile(archive, "wb", mtime=0) as gz:
        gz.write(buffer.getvalue())


def bundle_lock_name(root: Path, lock: Path) -> str:
    """How the requirements file names its source: a committed lock by its repo path, a
    cached one by what it is (never a local path)."""
    try:
        return lock.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return "a lock resolved from repro.toml's pins"
