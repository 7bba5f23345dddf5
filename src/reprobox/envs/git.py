"""A package from its git history: clones in the cache, refs resolved to shas, a wheel per sha.

A run against `NAME@git+URL@REF` or a checkout installs a wheel built here, locked by its hash
like any release (a hashed lock cannot hold a git URL or an editable install), so the record
names exactly which commit ran. A sha never moves, so its wheel is built once; a branch or a
pull request's ref is re-resolved (fetched) once per process. Clones and wheels appear in the
cache whole or not at all: each is made in a temporary folder and renamed into place.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from filelock import FileLock
from packaging.utils import canonicalize_name, parse_wheel_filename

from reprobox.core.errors import BadInput, EnvError
from reprobox.core.scrub import hide_url_credentials
from reprobox.core.settings import Settings
from reprobox.envs.uv import run_uv, uv_bin

SHA = re.compile(r"^[0-9a-f]{40}$")
_PR_MERGE = re.compile(r"^Merge pull request #(\d+)\b")
_PR_SQUASH = re.compile(r"\(#(\d+)\)\s*$")
TAG_FORMATS = ("v{version}", "{version}")  # the spellings of release tags found unasked
# fetched into every clone: branches, tags and GitHub's pull request heads
REFSPECS = ("+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*", "+refs/pull/*:refs/pull/*")


@dataclass(frozen=True)
class Commit:
    """One commit as a bisect answer names it."""

    sha: str
    subject: str
    author: str
    email: str
    date: str  # ISO 8601, the author's
    parents: tuple[str, ...]

    @property
    def short(self) -> str:
        return self.sha[:10]

    @property
    def is_merge(self) -> bool:
        return len(self.parents) > 1

    @property
    def pr(self) -> int | None:
        """The pull request a subject names: `Merge pull request #N` or a squash's `(#N)`."""
        found = _PR_MERGE.match(self.subject) or _PR_SQUASH.search(self.subject)
        return int(found.group(1)) if found else None


def is_git_source(value: str) -> bool:
    """Whether a package override names a git source (`git+URL@REF`), not a release."""
    return value.startswith("git+")


def split_source(value: str) -> tuple[str, str]:
    """`git+URL@REF` -> (URL, REF); the ref is what follows the last `@` after the path."""
    body = value.removeprefix("git+")
    url, at, ref = body.rpartition("@")
    if not at or not url or not ref or "/" not in url or url.endswith(":"):
        shown = hide_url_credentials(value)
        raise BadInput(f"{shown!r} is not of the form git+URL@REF (a branch, tag or sha)")
    return url, ref


def normalize_url(url_or_path: str) -> str:
    """A repository as git should clone it: URLs as they are, a local path as a file:// URL
    (so a clone in the cache is named the same from any folder, and a cell can name it)."""
    if "://" in url_or_path or re.match(r"^[\w.-]+@[\w.-]+:", url_or_path):
        return url_or_path.rstrip("/")
    return Path(url_or_path).expanduser().resolve().as_uri()


def web_link(url: str, sha: str | None = None, pr: int | None = None) -> str | None:
    """A browser link to a commit or pull request on GitHub (None for other hosts)."""
    parsed = urlparse(url if "://" in url else "ssh://" + url.replace(":", "/", 1))
    if parsed.hostname != "github.com":
        return None
    path = parsed.path.strip("/").removesuffix(".git")
    if pr is not None:
        return f"https://github.com/{path}/pull/{pr}"
    return f"https://github.com/{path}/commit/{sha}" if sha else f"https://github.com/{path}"


def run_git(args: list[str], *, what: str, cwd: Path | None = None) -> str:
    """Run git without prompts; a failure is one BadInput naming git's own last word."""
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true", "LC_ALL": "C"}
    try:
        proc = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, env=env, check=False
        )
    except FileNotFoundError:
        raise EnvError("git is not installed; a git source needs it") from None
    if proc.returncode != 0:
        lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
        why = next(
            (ln for ln in reversed(lines) if ln.startswith("fatal:")), lines[-1] if lines else ""
        )
        why = why.removeprefix("fatal:").strip() or "git failed"
        raise BadInput(hide_url_credentials(f"cannot {what}: {why}"))
    return proc.stdout


def clone_path(url: str, settings: Settings) -> Path:
    """Where the cache keeps the clone of `url`."""
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", url.rstrip("/").rsplit("/", 1)[-1])[:40]
    return settings.cache / "git" / f"{name}-{digest}.git"


_fetched: set[Path] = set()  # clones fetched by this process: refs move once per process


def ensure_clone(url: str, settings: Settings, *, fetch: bool = True) -> Path:
    """The cached clone of `url`, made if missing and (with `fetch`) fetched once per process.

    A clone is made in a temporary folder and renamed into place, so a failed or interrupted
    clone leaves nothing behind that a later run would trust."""
    url = normalize_url(url)
    dest = clone_path(url, settings)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dest) + ".lock"):
        if not (dest / "HEAD").is_file():
            tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
            try:
                run_git(["init", "--quiet", "--bare", str(tmp)], what=f"clone {url}")
                run_git(["remote", "add", "origin", url], what=f"clone {url}", cwd=tmp)
                _fetch(tmp, url, "clone")
                tmp.rename(dest)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            _fetched.add(dest)
        elif fetch and dest not in _fetched:
            _fetch(dest, url)
            _fetched.add(dest)
    return dest


def _fetch(clone: Path, url: str, verb: str = "fetch") -> None:
    run_git(
        ["fetch", "--quiet", "--prune", "--force", "origin", *REFSPECS],
        what=f"{verb} {url}",
        cwd=clone,
    )


def has_commit(clone: Path, sha: str) -> bool:
    proc = subprocess.run(
        ["git", "cat-file", "-e", f"{sha}^{{commit}}"], cwd=clone, capture_output=True, check=False
    )
    return proc.returncode == 0


def resolve(url: str, ref: str, settings: Settings) -> str:
    """The sha `ref` names in `url` now: a full sha as it is (fetched only when the clone
    lacks it), anything else (branch, tag, `refs/pull/N/head`, short sha) after a fetch."""
    url = normalize_url(url)
    if SHA.match(ref):
        clone = ensure_clone(url, settings, fetch=False)
        if has_commit(clone, ref):
            return ref
        clone = ensure_clone(url, settings)
        if has_commit(clone, ref):
            return ref
        raise BadInput(f"no commit {ref} in {hide_url_credentials(url)}")
    return _resolve_moving(url, ref, settings)


_moving: dict[tuple[str, str], str] = {}  # (url, ref) -> sha, as this process resolved it


def _resolve_moving(url: str, ref: str, settings: Settings) -> str:
    """A branch or tag resolved once per process: every cell of one run sees one commit."""
    key = (url, ref)
    if key in _moving:
        return _moving[key]
    clone = ensure_clone(url, settings)
    for candidate in (f"refs/heads/{ref}", f"refs/tags/{ref}", ref):
        proc = subprocess.run(
            ["git", "rev-parse", "--verify", "--quiet", f"{candidate}^{{commit}}"],
            cwd=clone, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if proc.returncode == 0 and proc.stdout.strip():
            _moving[key] = proc.stdout.strip()
            return _moving[key]
    raise BadInput(f"no branch, tag or commit {ref!r} in {hide_url_credentials(url)}")


def commit(clone: Path, sha: str) -> Commit:
    """A commit's subject, author and parents."""
    out = run_git(
        ["show", "-s", "--format=%H%x00%s%x00%an%x00%ae%x00%aI%x00%P", sha],
        what=f"read commit {sha}",
        cwd=clone,
    ).rstrip("\n")
    full, subject, author, email, date, parents = out.split("\0")
    return Commit(full, subject, author, email, date, tuple(parents.split()))


def is_ancestor(clone: Path, older: str, newer: str) -> bool:
    proc = subprocess.run(
        ["git", "merge-base", "--is-ancestor", older, newer], cwd=clone, check=False
    )
    return proc.returncode == 0


def merge_base(clone: Path, a: str, b: str) -> str:
    return run_git(["merge-base", a, b], what=f"find where {a} and {b} meet", cwd=clone).strip()


def first_parent_range(clone: Path, older: str, newer: str) -> list[str]:
    """`older`, then the first-parent line after it up to `newer`, oldest first: a merged or
    squash-merged pull request is one step."""
    out = run_git(
        ["rev-list", "--first-parent", "--reverse", f"{older}..{newer}"],
        what=f"list the commits {older[:10]}..{newer[:10]}",
        cwd=clone,
    )
    return [older, *out.split()]


def release_tag(clone: Path, version: str, tag_format: str | None = None) -> str:
    """The tag of a release: `v0.7.2` or `0.7.2`, or as `tag_format` spells it
    (`release-{version}`)."""
    formats = (tag_format,) if tag_format else TAG_FORMATS
    if tag_format is not None and "{version}" not in tag_format:
        raise BadInput(f"--tag-format {tag_format!r} has no {{version}}")
    tried = [f.format(version=version) for f in formats]
    for tag in tried:
        proc = subprocess.run(
            ["git", "rev-parse", "--verify", "--quiet", f"refs/tags/{tag}^{{commit}}"],
            cwd=clone, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if proc.returncode == 0:
            return tag
    hint = "" if tag_format else "; pass --tag-format (e.g. 'release-{version}')"
    raise BadInput(f"no tag for release {version} (tried {', '.join(tried)}){hint}")


# ---- wheels ---------------------------------------------------------------------------------


def wheel_dir(settings: Settings) -> Path:
    return settings.cache / "git-wheels"


def commit_wheel(url: str, sha: str, package: str, settings: Settings) -> Path:
    """The wheel of `package` built from commit `sha` of `url`, built once and kept: a
    commit that does not build is an environment failure (a bisect's skip)."""
    url = normalize_url(url)
    dest = wheel_dir(settings) / sha
    found = _wheel_in(dest, package)
    if found is not None:
        return found
    clone = ensure_clone(url, settings, fetch=False)
    if not has_commit(clone, sha):
        clone = ensure_clone(url, settings)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dest) + ".lock"):
        found = _wheel_in(dest, package)
        if found is not None:
            return found
        with tempfile.TemporaryDirectory(prefix=f"{sha[:10]}.", dir=dest.parent) as work:
            source = Path(work) / "src"
            _export(clone, sha, source)
            return _build(source, dest, package, f"{package} at {sha[:10]}", settings)


def checkout_wheel(path: Path, package: str, settings: Settings) -> tuple[str, Path]:
    """(what ran, wheel) for a checkout as it is now, uncommitted changes included: `<HEAD
    sha>` when clean, `<HEAD sha>+dirty.<tree>` when not; a folder outside git is built every
    time and named by its wheel's hash."""
    path = path.expanduser().resolve()
    if not path.is_dir():
        raise BadInput(f"--with-editable {package}: {path} is not a folder")
    inside = subprocess.run(
        ["git", "rev-parse", "--show-toplevel"], cwd=path, capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    if inside.returncode != 0:
        with tempfile.TemporaryDirectory(dir=_mkdir(wheel_dir(settings))) as work:
            built = _build(path, Path(work) / "out", package, f"{package} in {path}", settings)
            digest = hashlib.sha256(built.read_bytes()).hexdigest()[:16]
            dest = wheel_dir(settings) / f"dir-{digest}"
            return f"folder {path} (wheel {digest})", _place(built, dest)
    head = run_git(["rev-parse", "HEAD"], what=f"read {path}", cwd=path).strip()
    tree = _working_tree(path)
    committed = run_git(["rev-parse", "HEAD^{tree}"], what=f"read {path}", cwd=path).strip()
    label = head if tree == committed else f"{head}+dirty.{tree[:12]}"
    dest = wheel_dir(settings) / f"tree-{tree}"
    found = _wheel_in(dest, package)
    if found is not None:
        return label, found
    with FileLock(str(dest) + ".lock"):
        found = _wheel_in(dest, package)
        if found is not None:
            return label, found
        with tempfile.TemporaryDirectory(prefix="tree.", dir=dest.parent) as work:
            source = Path(work) / "src"
            _export(path, tree, source)
            return label, _build(source, dest, package, f"{package} in {path}", settings)


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _working_tree(path: Path) -> str:
    """The tree of the working copy now (tracked changes and untracked, unignored files),
    written through a scratch index so the user's own index is left alone."""
    with tempfile.TemporaryDirectory() as scratch:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(scratch) / "index")}
        for args in (["read-tree", "HEAD"], ["add", "-A", "."]):
            subprocess.run(["git", *args], cwd=path, env=env, capture_output=True, check=True)
        out = subprocess.run(
            ["git", "write-tree"], cwd=path, env=env, capture_output=True, text=True, check=True
        )
    return out.stdout.strip()


def _export(repo: Path, treeish: str, dest: Path) -> None:
    """The files of `treeish` in `dest` (git archive: no .git, nothing ignored)."""
    dest.mkdir(parents=True)
    archive = dest.with_suffix(".tar")
    run_git(["archive", "--format=tar", "-o", str(archive), treeish], what="export", cwd=repo)
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    archive.unlink()


def _build(source: Path, dest: Path, package: str, what: str, settings: Settings) -> Path:
    """`uv build --wheel` of `source` into `dest`, renamed into place only when whole."""
    out = dest.with_name(dest.name + f".building-{os.getpid()}")
    shutil.rmtree(out, ignore_errors=True)
    try:
        cmd = [uv_bin(), "build", "--wheel", "--quiet", "--out-dir", str(out), str(source)]
        try:
            run_uv(cmd, what=f"build {what}", settings=settings)
        except (BadInput, EnvError) as exc:
            raise EnvError(str(exc)) from None  # a commit that does not build: exit 3
        wheel = _wheel_in(out, package)
        if wheel is None:
            names = ", ".join(p.name for p in out.glob("*.whl")) or "nothing"
            raise EnvError(f"cannot build {what}: it built {names}, not a {package} wheel")
        return _place(wheel, dest)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _place(wheel: Path, dest: Path) -> Path:
    """Move a built wheel into its cache folder whole (a rename)."""
    staging = dest.with_name(dest.name + f".staging-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    shutil.move(str(wheel), staging / wheel.name)
    shutil.rmtree(dest, ignore_errors=True)
    staging.rename(dest)
    return dest / wheel.name


def _wheel_in(folder: Path, package: str) -> Path | None:
    if not folder.is_dir():
        return None
    for wheel in sorted(folder.glob("*.whl")):
        try:
            name = parse_wheel_filename(wheel.name)[0]
        except ValueError:
            continue
        if canonicalize_name(name) == canonicalize_name(package):
            return wheel
    return None


# ---- what the pipeline asks -----------------------------------------------------------------


@dataclass(frozen=True)
class Resolved:
    """A source override made installable: the wheel to lock and the commit it holds."""

    requirement: str  # `name @ file:///.../wheel.whl`
    commit: str  # the sha (or checkout state) that ran


def resolve_source(package: str, value: str, settings: Settings) -> Resolved:
    """`git+URL@REF` or `file://PATH` (a checkout) as a wheel to lock, and its commit."""
    if is_git_source(value):
        url, ref = split_source(value)
        sha = resolve(url, ref, settings)
        wheel = commit_wheel(url, sha, package, settings)
        return Resolved(f"{package} @ {wheel.as_uri()}", sha)
    if value.startswith("file://"):
        label, wheel = checkout_wheel(Path(urlparse(value).path), package, settings)
        return Resolved(f"{package} @ {wheel.as_uri()}", label)
    shown = hide_url_credentials(value)
    raise BadInput(f"{package}: {shown!r} is neither a version nor a git or file source")
