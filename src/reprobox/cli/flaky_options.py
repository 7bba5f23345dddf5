"""The flake-aware bisect's flags (--flaky, --confidence, --max-runs) and the strategy they
make with the plain ones (--confirm, --verify, --workers)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

from reprobox.core.spec import Repro

if TYPE_CHECKING:
    from reprobox.bisect.axes import Strategy


def add_arguments(parser: argparse.ArgumentParser, boolean: Callable[[str], bool]) -> None:
    """--flaky [BOOL], --confidence P, --max-runs N on a bisect command."""
    parser.add_argument(
        "--flaky",
        type=boolean,
        nargs="?",
        const=True,
        default=None,
        metavar="BOOL",
        help="flake-aware search for a noisy repro (default: on when the repro declares "
        "repeats): a posterior over the boundary, re-probing where it is unsure",
    )
    parser.add_argument(
        "--confidence",
        type=float,
        default=0.99,
        metavar="P",
        help="with --flaky: stop when one answer has this posterior (default 0.99)",
    )
    parser.add_argument(
        "--max-runs",
        type=int,
        default=300,
        metavar="N",
        help="with --flaky: stop after N probe runs, naming the candidates left (default 300)",
    )


def strategy(args: argparse.Namespace, repro: Repro) -> Strategy:
    """How this bisect searches; BadInput (exit 2) for a flag out of its range."""
    from reprobox.bisect.axes import Strategy, declares_noise  # bisects only

    flaky = declares_noise(repro) if args.flaky is None else args.flaky
    return Strategy(
        confirm=args.confirm,
        verify=args.verify,
        workers=args.workers,
        flaky=flaky,
        confidence=args.confidence,
        max_runs=args.max_runs,
    ).check()
