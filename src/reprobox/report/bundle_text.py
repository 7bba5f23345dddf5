"""The texts a bundle holds besides the repro's own files: run.sh, check.py, the Dockerfile
and the README (see `report.bundle`)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from reprobox.core import spec
from reprobox.report.byhand import TORCH_LINKS, ByHand, pip_line, top_pins

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


def run_sh(
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


def dockerfile(repro: spec.Repro, variants: Sequence[str]) -> str:
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


def readme(
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
