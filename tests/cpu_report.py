"""What each test costs in CPU: `pytest --cpu-report FILE` appends one JSON line per test
(its id, its worker, its wall seconds, and the CPU seconds of its worker and of the child
processes the test waited for), and `python tests/cpu_report.py FILE` sums them up.

Why not --durations alone: `make test` keeps both cores busy, so a test's wall time is
mostly its wait for a core, and a cheap test that ran beside an expensive one looks
expensive. CPU seconds add up to what the suite costs. Processes no test waits for
(Slurm's jobs under slurmd, a container under conmon, the cluster's daemons) are not
counted here; docs/testing.md shows how to count those with the kernel's process accounting.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from collections import Counter
from collections.abc import Generator
from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-report",
        metavar="FILE",
        help="append each test's CPU and wall seconds to FILE, one JSON line per test",
    )


def _cpu_s() -> tuple[float, float]:
    """CPU seconds of this process and of its children that have been waited for."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def _worker(config: pytest.Config) -> str:
    """This process's xdist worker id, or "main": read from its own config, not from
    PYTEST_XDIST_WORKER, which a pytest started by a test inherits."""
    workerinput = getattr(config, "workerinput", None)
    return str(workerinput["workerid"]) if workerinput else "main"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    """Around setup, call and teardown: what a test costs includes its fixtures."""
    path = item.config.getoption("cpu_report")
    if not path:
        return (yield)
    start, (own, children) = time.time(), _cpu_s()
    try:
        return (yield)
    finally:
        own_after, children_after = _cpu_s()
        line = {
            "id": item.nodeid,
            "worker": _worker(item.config),
            "start": round(start, 3),
            "wall_s": round(time.time() - start, 3),
            "own_cpu_s": round(own_after - own, 3),
            "children_cpu_s": round(children_after - children, 3),
        }
        with open(path, "a") as out:  # one short line per write: workers do not interleave
            out.write(json.dumps(line) + "\n")


def summarize(lines: list[dict], top: int) -> str:
    """The costliest tests, the costliest files and the total, in CPU seconds. A test
    that appears more than once (a file appended to by several runs) is summed."""
    cost: Counter[str] = Counter()
    wall: Counter[str] = Counter()
    by_file: Counter[str] = Counter()
    for row in lines:
        cpu = row["own_cpu_s"] + row["children_cpu_s"]
        cost[row["id"]] += cpu
        wall[row["id"]] += row["wall_s"]
        by_file[row["id"].split("::", 1)[0]] += cpu
    out = [f"{len(lines)} tests, {sum(cost.values()):.0f} CPU-s", "", "CPU-s  wall-s  test"]
    for test, cpu in cost.most_common(top):
        out.append(f"{cpu:6.1f} {wall[test]:7.1f}  {test}")
    out += ["", "CPU-s  file"]
    out += [f"{cpu:6.1f}  {name}" for name, cpu in by_file.most_common(top)]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description="Sum up a --cpu-report file.")
    parser.add_argument("file", type=Path)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    lines = [json.loads(x) for x in args.file.read_text().splitlines() if x.strip()]
    print(summarize(lines, args.top))


if __name__ == "__main__":
    main()
