"""The `report` command: an upstream-ready report of one repro (markdown, plots, merged
results), optionally posted as an issue comment. `cli.main` adds it with
`register(subparsers)`; the handler returns an exit code and raises `ReproboxError` for
failures, which `cli.main` turns into one line.
"""

from __future__ import annotations

import argparse
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from reprobox.cli import ui
from reprobox.report.post import parse_target, post


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `report` to the `reprobox` parser."""
    report = subparsers.add_parser(
        "report", help="write an upstream-ready report (markdown, plots, merged results)"
    )
    report.add_argument("repro", help="the repro to report on (its results on disk)")
    report.add_argument("--out", type=Path, help="folder (default: results/<repro>/_report)")
    report.add_argument(
        "--post", metavar="OWNER/REPO#N", help="post it as an issue comment with gh"
    )
    report.add_argument(
        "--no-env", action="store_true", help="skip torch's collect_env (no environment needed)"
    )
    report.set_defaults(handler=cmd_report)


def _progress() -> AbstractContextManager[Any]:
    """A spinner for a person at a terminal; plain lines under CI or in a pipe."""
    if ui.interactive():
        return ui.console.status("report")
    return nullcontext()


def cmd_report(args: argparse.Namespace) -> int:
    from reprobox.core.settings import Settings
    from reprobox.report.build import ReportOptions, write_report  # matplotlib: only when reporting

    settings = getattr(args, "settings", None) or Settings.from_env()
    root = settings.root
    options = ReportOptions(out=args.out, results=settings.results, collect_env=not args.no_env)
    target = parse_target(args.post) if args.post else None  # bad input fails before any work
    with _progress() as status:

        def progress(message: str) -> None:
            if status is not None:
                status.update(message)
            else:
                ui.info(message)

        report = write_report(root, args.repro, options, progress)
    for skipped in report.skipped:
        ui.info(f"reprobox: warning: skipped {skipped}")
    ui.info(f"report: {report.markdown} ({report.records} cells, {len(report.plots)} plots)")
    if target is not None:
        url = post(target, report.comment)
        ui.info(f"posted to {target}: {url}" if url else f"posted to {target}")
    return 0
