"""A bundle's run.sh (see `report.bundle`): POSIX sh a maintainer runs in one line.

`./run.sh all` runs every variant and ends with a table (exit 0 when each gave its expected
verdict, 1 otherwise); `./run.sh VARIANT` exits with the verdict code. The launcher's output
goes to `logs/VARIANT.log`, so the traceback torchrun prints when a script exits 1 to mean
"reproduced" is never read as a crash; the log's tail is shown only when a run failed.
Variants with the same lock share one venv. What the system must provide (a compiler for a
JIT-built op) is checked before anything is installed, and named.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from reprobox.core import spec
from reprobox.core.bisect_codes import STOP, bisect_code
from reprobox.core.errors import ExitCode
from reprobox.report.byhand import TORCH_LINKS, ByHand

LOG_TAIL_LINES = 30
# Debian/Ubuntu packages (repro.toml's [image] system_packages) and the command each gives,
# so run.sh can check for it on any system; a package not listed here is named, not checked.
PACKAGE_COMMANDS = {
    "g++": "g++",
    "gcc": "gcc",
    "clang": "clang",
    "make": "make",
    "cmake": "cmake",
    "ninja-build": "ninja",
    "git": "git",
}
# torchrun's (and accelerate launch's) first line about failed ranks: what follows is its own
# summary (ranks, pids, a link), the ranks' own error is above it
ELASTIC_FAILED = "elastic/multiprocessing/api.py.*failed (exitcode"
HEADER_PACKAGES = {"python3-dev"}  # Python.h, checked in each venv's own interpreter
# What a variant's verdict may be for `all` to count it as expected: its expectation and
# also_ok; `unknown` records a measurement, so any verdict (never an error) is as expected.
_ANY = ("clean", "reproduced", "cannot_test")
# What `./run.sh VARIANT` exits with (its usage text): verdicts, 2 bad usage, 3 the system or
# the install, 4 an error; `./run.sh verdict` maps them by `bisect_code`.
RUN_SH_CODES = (ExitCode.OK, ExitCode.FAILED, ExitCode.CANNOT_TEST, ExitCode.BAD_INPUT,
                ExitCode.ENV_FAILED, ExitCode.RUN_FAILED, ExitCode.INTEGRITY)  # fmt: skip
SUMS_FILE = "requirements/SHA256SUMS"  # each lock's sha256 as bundled: checked on every run
# pip's and uv's words for a download that does not match the lock's --hash
HASH_MISMATCH = "do not match the hashes|hash mismatch"
_SAID = {
    int(ExitCode.CANNOT_TEST): "the system lacks what the bundle needs, or its environment "
    "did not install: skip (exit 125)",
    STOP: "neither clean, reproduced nor skip: stopping git bisect (exit 255)",
}


@dataclass(frozen=True)
class SystemNeeds:
    """What repro.toml says the system must provide, as run.sh checks it."""

    packages: tuple[str, ...]  # as named for apt-get
    commands: tuple[str, ...]  # checked on PATH
    headers: bool  # Python.h in the venv's interpreter

    @classmethod
    def of(cls, repro: spec.Repro) -> SystemNeeds:
        packages = tuple(repro.spec.image.system_packages)
        commands = tuple(PACKAGE_COMMANDS[p] for p in packages if p in PACKAGE_COMMANDS)
        return cls(packages, commands, any(p in HEADER_PACKAGES for p in packages))

    def unchecked(self) -> list[str]:
        return [p for p in self.packages if p not in PACKAGE_COMMANDS and p not in HEADER_PACKAGES]


def accepted(repro: spec.Repro, variant: str) -> list[str]:
    """The verdicts `./run.sh all` counts as expected for `variant`."""
    found = repro.variant(variant)
    if found.expect.value == "unknown":
        return list(_ANY)
    return list(dict.fromkeys([found.expect.value, *(v.value for v in found.also_ok)]))


def run_sh(
    repro: spec.Repro,
    variants: Sequence[str],
    lines: Mapping[str, ByHand],
    envs: Mapping[str, str],
    late: Mapping[str, bool],
    cpu_torch: Mapping[str, bool],
    python: str,
    install_env: Mapping[str, str],
) -> str:
    """run.sh: what the bundle's README says, in POSIX sh. `envs` maps each variant to its
    environment's id (variants with the same lock share one)."""
    names = " ".join(variants)
    needs = SystemNeeds.of(repro)
    width = max(len("variant"), *(len(v) for v in variants))
    groups: dict[str, list[str]] = {}
    for v in variants:
        groups.setdefault(envs[v], []).append(v)
    env_cases = "\n".join(f"    {'|'.join(vs)}) echo {env} ;;" for env, vs in groups.items())
    expect_cases = "\n".join(f"    {v}) echo {' '.join(accepted(repro, v))} ;;" for v in variants)
    launch_cases = "\n".join(
        f'      {v}) REPRO_RESULT="$PWD/result-{v}.json" {lines[v].line()} ;;' for v in variants
    )
    lates = " ".join(v for v in variants if late[v]) or "-"
    cpus = " ".join(v for v in variants if cpu_torch[v]) or "-"
    exports = "".join(f"export {k}={shlex.quote(val)}\n" for k, val in install_env.items())
    py_tuple = python.replace(".", ", ")
    verdict_cases = verdict_case_lines()
    stop = STOP
    return f"""\
#!/bin/sh
# {repro.name}: {repro.spec.repro.title}
# Runs the variants with no reprobox: a venv beside this file for each lock (uv, else
# python3 -m venv + pip), the lock's hashed requirements, then the variant's launcher line
# (see README.md). The launcher's output goes to logs/VARIANT.log; only the verdict is
# printed, with the log's tail when a run failed.
#
# Usage: ./run.sh [--install-only] [all | VARIANT]      variants: {names}
#   ./run.sh all      every variant, then a table; exits 0 when each gave its expected
#                     verdict, 1 otherwise
#   ./run.sh VARIANT  exits with the verdict code: 0 clean, 1 reproduced, 125 cannot test
#                     here, 4 error (no result, a result its metrics or exit status
#                     contradict)
#   Either way: 2 bad usage, 3 the system lacks what the bundle needs or an install failed,
#   6 a lock does not match its hashes (requirements/SHA256SUMS, checked on every run, or a
#   download that does not match the lock's --hash): an error, never a skip.
#   ./run.sh verdict VARIANT   for `git bisect run`: 0 clean, 1 reproduced, 125 skip (cannot
#                     test here, or the environment did not install), 255 anything else
#                     (git aborts): a broken environment is never read as "bad"
# Env:   TORCH_CPU_LINKS  where torch's CPU build (torch==X+cpu) is found: a URL or a folder of
#                         wheels (default {TORCH_LINKS}); empty: only what
#                         UV_FIND_LINKS / PIP_FIND_LINKS / your index configuration give
#        PYTHON           the interpreter for the pip path (default python3; needs {python})
set -u
if [ "${{1:-}}" = verdict ]; then  # the one rule of `reprobox verdict`, as git bisect run reads
  shift
  if [ "$#" != 1 ] || [ "$1" = all ] || [ "$1" = --install-only ]; then
    echo "run.sh: verdict takes one variant, not: ${{*:-nothing}}" >&2; exit {stop}
  fi
  sh "$0" "$1"
  code=$?
  case $code in
{verdict_cases}
    *) echo "run.sh: exit status $code is neither clean, reproduced nor skip: stopping" >&2
       exit {stop} ;;
  esac
fi
cd "$(dirname "$0")" || exit 4
VARIANTS="{names}"
install_only=
if [ "${{1:-}}" = --install-only ]; then install_only=1; shift; fi
target=${{1:-{variants[0]}}}
if [ "$#" -gt 1 ]; then echo "run.sh: one variant or 'all', not: $*" >&2; exit 2; fi
case " all $VARIANTS " in
  *" $target "*) ;;
  *) echo "run.sh: unknown variant '$target'; one of: all $VARIANTS" >&2; exit 2 ;;
esac
links=${{TORCH_CPU_LINKS-{TORCH_LINKS}}}
{exports}
{system_check(needs)}if ! command -v uv >/dev/null 2>&1; then
  py=${{PYTHON:-python3}}
  if ! "$py" -c 'import sys; sys.exit(sys.version_info[:2] != ({py_tuple}))' 2>/dev/null; then
    echo "run.sh: no uv, and $py is not python {python} (the lock's): install uv or set PYTHON" >&2
    exit 3
  fi
fi
mkdir -p logs

env_of() {{
  case $1 in
{env_cases}
  esac
}}

expected_of() {{
  case $1 in
{expect_cases}
  esac
}}

show_tail() {{  # LOG: its last lines, up to the launcher's own summary of the failed ranks
  summary=$(grep -n -m 1 '{ELASTIC_FAILED}' "$1" | cut -d: -f1)
  if [ -n "$summary" ] && [ "$summary" -gt 1 ]; then
    echo "run.sh: the last lines of $1 before torchrun's summary of the failed ranks:" >&2
    head -n "$((summary - 1))" "$1" | tail -n {LOG_TAIL_LINES} | sed 's/^/  | /' >&2
  else
    echo "run.sh: the last {LOG_TAIL_LINES} lines of $1:" >&2
    tail -n {LOG_TAIL_LINES} "$1" | sed 's/^/  | /' >&2
  fi
}}

install_into() {{  # VENV VARIANT [--find-links LINKS]: the variant's lock into VENV
  venv=$1 req=requirements/$2.txt late=
  case " {lates} " in *" $2 "*) late=requirements/$2.late.txt ;; esac
  shift 2
  if command -v uv >/dev/null 2>&1; then
    [ -x "$venv/bin/python" ] || uv venv --quiet --python {python} "$venv" || return
    uv pip sync --require-hashes --python "$venv/bin/python" "$@" "$req" || return
    if [ -n "$late" ]; then
      uv pip install --require-hashes --no-deps --no-build-isolation \\
        --python "$venv/bin/python" "$@" -r "$late" || return
    fi
  else
    [ -x "$venv/bin/python" ] || "$py" -m venv "$venv" || return
    "$venv/bin/python" -m pip install --require-hashes --no-deps "$@" -r "$req" || return
    if [ -n "$late" ]; then
      "$venv/bin/python" -m pip install --require-hashes --no-deps --no-build-isolation \\
        "$@" -r "$late" || return
    fi
  fi
}}

sha_of() {{  # FILE: its sha256 (sha256sum, else shasum -a 256), nothing when neither exists
  if command -v sha256sum >/dev/null 2>&1; then sha256sum "$1" | cut -d' ' -f1
  elif command -v shasum >/dev/null 2>&1; then shasum -a 256 "$1" | cut -d' ' -f1
  fi
}}

check_lock() {{  # VARIANT: its locks are the ones bundled, on every run (else exit 6)
  for req in "requirements/$1.txt" "requirements/$1.late.txt"; do
    want=$(grep " $req\\$" {SUMS_FILE} 2>/dev/null | cut -d' ' -f1)
    [ -n "$want" ] || [ -f "$req" ] || continue  # no late packages
    if [ -z "$want" ]; then
      echo "run.sh: $req is not in {SUMS_FILE}: not the bundle's lock" >&2; return 6
    fi
    got=$(sha_of "$req" 2>/dev/null)
    if [ -z "$got" ]; then
      echo "run.sh: no sha256sum or shasum to check $req with: install coreutils" >&2; return 3
    fi
    if [ "$got" != "$want" ]; then
      echo "run.sh: $req is not the lock this bundle was made with (sha256 $got, bundled" \\
        "$want): its environment would not be the one reported; unpack the bundle again" >&2
      return 6
    fi
  done
}}

install() {{  # VARIANT: its environment, once per lock (.venv-ID/.installed marks it done)
  check_lock "$1" || return
  venv=.venv-$(env_of "$1")
  [ -f "$venv/.installed" ] && return 0
  log=logs/install-$(env_of "$1").log
  echo "run.sh: installing $venv for $1 (log: $log)"
  set -- "$1"
  if [ -d wheelhouse ]; then  # the bundle's own files (bundle --wheelhouse): no index at all
    set -- "$1" --no-index --find-links "$PWD/wheelhouse"
  else
    case " {cpus} " in *" $1 "*) [ -n "$links" ] && set -- "$1" --find-links "$links" ;; esac
  fi
  if ! install_into "$venv" "$@" >"$log" 2>&1; then
    echo "run.sh: installing $venv failed" >&2
    show_tail "$log"
    if grep -q -i -E '{HASH_MISMATCH}' "$log"; then
      echo "run.sh: a download does not match the lock's hash: an error, not a skip" >&2
      return 6
    fi
    return 3
  fi
{header_check(needs)}  touch "$venv/.installed"
}}

run_one() {{  # VARIANT: runs it; its verdict code in $code
  install "$1" || {{ code=$?; return; }}
  [ -z "$install_only" ] || {{ code=0; return; }}
  venv=$PWD/.venv-$(env_of "$1")
  log=logs/$1.log
  rm -f "result-$1.json"
  status=0
  (
    PATH="$venv/bin:$PATH"
    export PATH VIRTUAL_ENV="$venv"
    case $1 in
{launch_cases}
    esac
  ) >"$log" 2>&1 </dev/null || status=$?
  "$venv/bin/python" check.py "$1" "result-$1.json" "$status"
  code=$?
  echo "  launcher log: $log (exit status $status)"
  [ "$code" = 4 ] && show_tail "$log"
  return 0
}}

if [ "$target" != all ]; then
  run_one "$target"
  exit "$code"
fi
rows= failed=0
for variant in $VARIANTS; do
  [ -n "$install_only" ] || echo "== $variant"
  run_one "$variant"
  case $code in
    0) got=clean ;; 1) got=reproduced ;; 125) got=cannot_test ;; *) got=error ;;
  esac
  case " $(expected_of "$variant") " in
    *" $got "*) mark=ok ;;
    *) mark=UNEXPECTED failed=1 ;;
  esac
  rows="$rows$variant $(expected_of "$variant" | tr ' ' /) $got $mark
"
done
if [ -n "$install_only" ]; then [ "$failed" = 0 ] || exit 3; exit 0; fi
echo
printf '%-{width}s  %-24s  %-12s\\n' variant expected verdict
printf '%s' "$rows" | while read -r variant wanted got mark; do
  printf '%-{width}s  %-24s  %-12s  %s\\n' "$variant" "$wanted" "$got" "$mark"
done
if [ "$failed" = 0 ]; then
  echo "run.sh: every variant gave its expected verdict"
else
  echo "run.sh: some variants did not give their expected verdict (see above and logs/)"
fi
exit "$failed"
"""


def verdict_case_lines() -> str:
    """`case` lines mapping each exit status run.sh gives to `git bisect run`'s answer by
    `core.bisect_codes`, the rule `reprobox verdict` ends with (a status not listed: 255)."""
    lines = []
    for code in RUN_SH_CODES:
        answer = bisect_code(code)
        said = "" if answer == code else f'echo "run.sh: {_SAID[answer]}" >&2; '
        lines.append(f"    {code}) {said}exit {answer} ;;")
    return "\n".join(lines)


def system_check(needs: SystemNeeds) -> str:
    """Before anything is installed: the commands repro.toml's system packages give, each
    looked for on PATH, and the ones missing named with the packages to install."""
    if not needs.commands:
        return ""
    return f"""\
# What the system must provide (repro.toml's system packages: {" ".join(needs.packages)})
missing=
for tool in {" ".join(needs.commands)}; do
  command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"
done
if [ -n "$missing" ]; then
  echo "run.sh: this bundle needs {" and ".join(needs.commands)} on PATH; missing:$missing" \\
    "(Debian/Ubuntu: apt-get install {" ".join(needs.packages)})" >&2
  exit 3
fi
"""


def header_check(needs: SystemNeeds) -> str:
    """The venv's interpreter must find Python.h when a package is built against it (a
    JIT-compiled op); named with the package that provides it."""
    if not needs.headers:
        return ""
    probe = (
        "import os, sys, sysconfig; "
        "sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))"
    )
    return (
        f'  if ! "$venv/bin/python" -c "{probe}"; then\n'
        "    echo \"run.sh: $venv's python has no Python.h (Debian/Ubuntu: apt-get install "
        'python3-dev)" >&2\n'
        "    exit 3\n"
        "  fi\n"
    )
