"""The texts a bundle holds besides the repro's own files and run.sh (`bundle_run`): check.py,
the Dockerfile and the README (see `report.bundle`)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from reprobox.core import spec
from reprobox.report.bundle_run import SystemNeeds
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
    if verdict == "clean" and launcher_status not in ("0", "?"):
        print(f"error: the result says clean but the launcher exited {launcher_status} "
              "(a rank failed after rank 0 wrote it)")
        return 4
    print(f"{verdict}: " + "; ".join(shown))
    if result.get("reason"):
        print(f"  {result['reason']}")
    also = spec.get("also_ok", {}).get(variant, [])
    print(f"  expected for {variant}: {expect}" + (f" (or {', '.join(also)})" if also else ""))
    return CODES[verdict]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "?"))
'''


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
    envs: Mapping[str, str],
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
    needs = SystemNeeds.of(repro)
    out += ["", "## Run it", ""]
    if needs.packages:
        checked = " and ".join(f"`{c}`" for c in needs.commands)
        out += [
            "The system must provide "
            + ", ".join(f"`{p}`" for p in needs.packages)
            + " (Debian/Ubuntu package names: `apt-get install "
            + " ".join(needs.packages)
            + "`)"
            + (f"; `run.sh` checks for {checked} first and exits 3, naming what is missing"
               if checked else "")
            + ".",
            "",
        ]  # fmt: skip
    out += [
        "```sh",
        "./run.sh all        # every variant, then a table: exit 0 when each gave its expected "
        "verdict, 1 otherwise",
        f"./run.sh {variants[0]}{' ' * max(1, 11 - len(variants[0]))}"
        "# one variant: exit 0 clean, 1 reproduced, 125 cannot test here, 4 error",
        "```",
        "",
        "Each run prints its verdict and the metric that decides it; the launcher's own output "
        "goes to `logs/VARIANT.log` (a script exits 1 to mean *reproduced*, so torchrun prints "
        "a `ChildFailedError` there: that is the verdict, not a crash). When a run fails, "
        "`run.sh` shows the log's tail and exits 4. Exit 2 is bad usage, 3 a system that lacks "
        "what the bundle needs or an install that failed (its log's tail shown), 6 a lock "
        "that is not the one bundled (`requirements/SHA256SUMS`, checked on every run) or a "
        "download that does not match the lock's hashes. "
        "`./run.sh --install-only all` installs without running. Under `git bisect run`, "
        "use `./run.sh verdict VARIANT`: 0 clean, 1 reproduced, 125 skip (cannot test here, a "
        "system that lacks what the bundle needs, an install that failed), 255 anything else, "
        "a lock that does not match its hashes included "
        "(git stops), so a broken environment is never taken for a bad commit.",
        "",
        "`run.sh` makes a venv beside this file for each lock (variants with the same lock "
        "share one: `.venv-ID`), with uv, or with `python3 -m venv` + pip when uv is absent, "
        "and does what follows:",
        "",
    ]
    env_line = " ".join(f"{k}={shlex.quote(v)}" for k, v in install_env.items())
    groups: dict[str, list[str]] = {}
    for v in variants:
        groups.setdefault(envs[v], []).append(v)
    for env, members in groups.items():
        v = members[0]  # the members' requirements are the same
        links = ' --find-links "$TORCH_CPU_LINKS"' if cpu_torch[v] else ""
        steps = [f"export TORCH_CPU_LINKS={TORCH_LINKS}"] if cpu_torch[v] else []
        steps += [f"uv venv --python {python} .venv-{env}", f". .venv-{env}/bin/activate"]
        sync = f"uv pip sync --require-hashes{links} requirements/{v}.txt"
        steps.append(f"{env_line} {sync}".strip())
        if late[v]:
            steps.append(
                f"{env_line} uv pip install --require-hashes --no-deps --no-build-isolation"
                f"{links} -r requirements/{v}.late.txt".strip()
            )
        for member in members:
            expect = repro.variant(member).expect.value
            steps += ["", f"# {member} (expected {expect})", lines[member].line()]
        heading = ", ".join(f"`{m}`" for m in members)
        one = " (one lock: one environment)" if len(members) > 1 else ""
        out += [f"### {heading}{one}", "", "```sh", *steps, "```", ""]
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
        "- `run.sh`, `check.py` (the verdict rule, `verdict.json`), `Dockerfile`; `logs/` and "
        "`result-VARIANT.json` are written by runs",
        "",
    ]
    return "\n".join(out)
