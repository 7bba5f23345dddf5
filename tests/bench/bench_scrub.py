"""scrub: seconds to scrub the text shapes that made a backtracking scrubber quadratic (one
long unbroken word, a base64 blob, a hex dump, a tensor on one line) and the most a kept log
holds (8 MiB of 1 KiB lines), through the same `Scrubber` a run and an export use.

    .venv/bin/nox -s bench -- scrub [--times 3] [--cap 60]

Each case runs in a process of its own, cut at `--cap` seconds (then reported as
`over_cap_s`), so a quadratic scrubber still finishes the benchmark. Figures are medians.
"""

from __future__ import annotations

import argparse
import base64
import multiprocessing
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from common import emit

from reprobox.core.scrub import Scrubber

KIB = 1024
MIB = 1024 * KIB


def _word(size: int) -> str:
    return "a" * size


def _base64(size: int) -> str:
    return base64.b64encode(random.Random(0).randbytes(size * 3 // 4)).decode()[:size]


def _hex(size: int) -> str:
    return random.Random(1).randbytes(size // 2).hex()


def _tensor(size: int) -> str:
    rng = random.Random(2)
    row = ", ".join(f"{rng.uniform(-3, 3):.4f}" for _ in range(256)) + ", "
    return ("tensor([" + row * (size // len(row) + 1))[:size] + "])"


def _lines(line: Callable[[int], str], total: int, width: int = KIB) -> str:
    one = line(width - 1)
    return "\n".join(one for _ in range(total // width)) + "\n"


def _log_lines(total: int) -> str:
    """A training log: steps, losses, paths, a few assignments and flags."""
    sample = (
        "step 120/4000 loss=2.3141 lr=3e-05 grad_norm=0.913 --model_name gpt2 "
        "checkpoint=/tmp/run/ckpt-120 TOKENIZERS_PARALLELISM=false HF_HOME=/tmp/hf {}"
    )
    one = sample.format("x" * (KIB - len(sample) - 1))[: KIB - 1]
    return "\n".join(one for _ in range(total // KIB)) + "\n"


CASES: dict[str, Callable[[], str]] = {
    "word_8KiB_line": lambda: _word(8 * KIB),
    "word_32KiB_line": lambda: _word(32 * KIB),
    "word_1MiB_line": lambda: _word(MIB),
    "base64_1MiB_line": lambda: _base64(MIB),
    "hex_1MiB_line": lambda: _hex(MIB),
    "tensor_1MiB_line": lambda: _tensor(MIB),
    "dotted_1MiB_line": lambda: "a." * (MIB // 2),
    "dashed_1MiB_line": lambda: "-a" * (MIB // 2),
    "mysql_words_1MiB_line": lambda: ("mysql " * (MIB // 6 + 1))[:MIB],
    "key_begins_1MiB_line": lambda: "-----BEGIN RSA PRIVATE KEY----- " * (MIB // 32),
    "word_8MiB_of_1KiB_lines": lambda: _lines(_word, 8 * MIB),
    "log_8MiB_of_1KiB_lines": lambda: _log_lines(8 * MIB),
}


def _one(name: str, out: Any) -> None:
    text = CASES[name]()
    scrubber = Scrubber(environ={"HF_TOKEN": "hf_notarealtoken1234567890"}, home="/home/u")
    started = time.perf_counter()
    scrubber.text(text)
    out.put(time.perf_counter() - started)


def _timed(name: str, cap: float) -> float | None:
    """Seconds of one scrub of the case, or None when it ran past `cap`."""
    out: Any = multiprocessing.Queue()
    proc = multiprocessing.Process(target=_one, args=(name, out))
    proc.start()
    proc.join(cap)
    if proc.is_alive():
        proc.kill()
        proc.join()
        return None
    return float(out.get())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--times", type=int, default=3)
    parser.add_argument("--cap", type=float, default=60.0)
    parser.add_argument("--only", nargs="*", default=None, help="case names (default: all)")
    args = parser.parse_args()
    figures: dict[str, Any] = {}
    for name in args.only or CASES:
        walls: list[float] = []
        for _ in range(args.times):
            wall = _timed(name, args.cap)
            if wall is None:
                figures[name] = {"over_cap_s": args.cap}
                break
            walls.append(wall)
        else:
            figures[name] = {
                "median_s": round(statistics.median(walls), 3),
                "runs_s": [round(w, 3) for w in walls],
            }
    emit(figures)


if __name__ == "__main__":
    main()
