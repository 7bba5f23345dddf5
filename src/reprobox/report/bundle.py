"""A folder (and a .tar.gz of it) that reproduces a bug with no reprobox.

A maintainer runs what is attached to the issue, not a harness checkout. The bundle holds
the script and what it reads (configs, helper modules), the fix modules its variants use,
per variant the hashed requirements of its lock and the short list of top-level pins, a
README with the exact commands (`uv venv`, `uv pip sync`, then the launcher line as a person
types it), a `run.sh` doing exactly that (`bundle_run`: one venv per lock, the launcher's
output in a log, `./run.sh all` ending in a verdict table), its `check.py` (the verdict rule
of repro.toml, stdlib only), and a Dockerfile around `run.sh`.

Every file is scrubbed as the comment is (`Scrubber`: the environment's secret values,
secret-shaped tokens, home paths), and the bundle names the files that held any.
Nothing machine-specific goes in: where torch's CPU build comes from is read at run time
(`TORCH_CPU_LINKS`, default the PyTorch CPU index's torch page; `UV_FIND_LINKS` /
`PIP_FIND_LINKS` work too).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import tarfile
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from reprobox.core import spec
from reprobox.core.errors import BadInput
from reprobox.core.scrub import Scrubber
from reprobox.envs.torch_source import pinned_torch
from reprobox.envs.venvs import split_lock
from reprobox.report import bundle_text as texts
from reprobox.report.bundle_run import SUMS_FILE, accepted, run_sh
from reprobox.report.byhand import TORCH_LINKS, ByHand, by_hand, pip_line, top_pins

__all__ = ["TORCH_LINKS", "Bundle", "ByHand", "by_hand", "pip_line", "top_pins", "write_bundle"]

BUNDLE_DIR = "_bundle"
MARKER = ".reprobox-bundle"  # marks a folder this module wrote (and may replace)
VERDICT_FILE = "verdict.json"  # the variants' rules and expectations, for check.py
_FILES = (".py", ".yaml", ".yml", ".json", ".cfg", ".txt")
VERDICT_CODES = {"clean": 0, "reproduced": 1, "cannot_test": 125}


class BundleError(BadInput):
    """The bundle cannot be written (unknown variant, foreign folder, missing lock)."""


@dataclass(frozen=True)
class Bundle:
    dir: Path  # the folder
    archive: Path  # the .tar.gz of it
    variants: list[str]
    scrubbed: list[str] = field(default_factory=list)  # files that held a secret, as bundled


WHEELHOUSE = "wheelhouse"  # the bundle's folder of wheels and sdists (`bundle --wheelhouse`)


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
    also = {v: [a for a in accepted(repro, v) if a != expect[v]] for v in variants}
    also = {v: found for v, found in also.items() if found and expect[v] != "unknown"}
    shown = {"repro": repro.name, "rules": rules, "expect": expect, "also_ok": also}
    return json.dumps(shown, indent=2) + "\n"


def _env_id(first: str, second: str) -> str:
    """One environment per lock: variants whose requirements are the same (headers aside,
    they name the lock's source) share a venv, named by what it holds."""
    body = "".join(line for line in (first + second).splitlines(True) if not line.startswith("#"))
    return hashlib.sha256(body.encode()).hexdigest()[:10]


def write_bundle(
    repro: spec.Repro,
    variants: Sequence[str],
    locks: Mapping[str, Path],
    out: Path,
    platform: str = "cpu",
    lock_names: Mapping[str, str] | None = None,
    scrubber: Scrubber | None = None,
    wheelhouse: Path | None = None,
) -> Bundle:
    """Write `out/<repro>-bundle/` and `out/<repro>-bundle.tar.gz` for `variants`, each
    installed from its lock in `locks` (the committed one, where there is one; the caller
    resolves them). With `wheelhouse` (a folder of every file the locks install), the bundle
    carries it as `wheelhouse/` and run.sh installs from it alone, no index: the same
    environment months later, whatever the index holds then. A failure leaves any earlier
    bundle in `out` as it was."""
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
        envs: dict[str, str] = {}
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
            envs[v] = _env_id(first, second)
            pins = "\n".join(top_pins(repro, v, platform)) + "\n"
            (folder / "requirements" / f"{v}.pins.txt").write_text(pins)
        lines = {v: by_hand(repro, v) for v in variants}
        python = repro.python(platform)
        install_env = repro.install_env(platform)
        (folder / VERDICT_FILE).write_text(_verdict_json(repro, variants))
        (folder / "check.py").write_text(texts.CHECK_PY)
        run_file = folder / "run.sh"
        run_file.write_text(
            run_sh(repro, variants, lines, envs, late, cpu_torch, python, install_env)
        )
        run_file.chmod(0o755)
        (folder / "Dockerfile").write_text(texts.dockerfile(repro, variants))
        (folder / ".dockerignore").write_text(".venv-*\nresult-*.json\nlogs/\n")
        readme = texts.readme(
            repro, variants, lines, envs, late, cpu_torch, python, install_env, platform, files
        )
        (folder / "README.md").write_text(readme)
        scrubbed = _scrub_files(folder, scrubber or Scrubber())
        if wheelhouse is not None:  # the index's own files, each checked by its lock's hash
            (folder / WHEELHOUSE).mkdir()
            for file in sorted(wheelhouse.iterdir()):
                if file.is_file():  # (a link to the file: its bytes are copied)
                    shutil.copyfile(file, folder / WHEELHOUSE / file.name)
        _write_sums(folder)  # after scrubbing: the locks as they are shipped
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
    return Bundle(out / name, out / f"{name}.tar.gz", list(variants), scrubbed)


def _scrub_files(folder: Path, scrub: Scrubber) -> list[str]:
    """Scrub every file of the bundle in place (the bundle is attached to a public issue, as
    the comment is); the names of those that changed, so the caller can say so. A file that
    is not text cannot be checked, so it is refused."""
    changed = []
    for path in sorted(folder.rglob("*")):
        if not path.is_file():
            continue
        name = path.relative_to(folder).as_posix()
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            raise BundleError(f"{name} is not text, so it cannot be checked for secrets") from None
        if name == VERDICT_FILE:
            # The bundle's own expectations, written here from repro.toml: scrubbed value by
            # value, so `"secret_leak": "reproduced"` (a variant's name, its verdict) is never
            # read as a secret's name and its value, and redacted.
            data = json.loads(text)
            clean = json.dumps(scrub.data(data), indent=2) + "\n"
        else:
            clean = scrub.text(text)
        if clean != text:
            path.write_text(clean)
            changed.append(name)
    return changed


def _write_sums(folder: Path) -> None:
    """requirements/SHA256SUMS: each lock's sha256, which run.sh checks on every run (a lock
    edited after the install would otherwise run the old environment, unseen)."""
    lines = [
        f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.relative_to(folder).as_posix()}"
        for path in sorted((folder / "requirements").glob("*.txt"))
        if not path.name.endswith(".pins.txt")
    ]
    (folder / SUMS_FILE).write_text("\n".join(lines) + "\n")


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
