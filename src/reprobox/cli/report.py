"""The `report` command: an upstream-ready report of one repro (comment, markdown, html,
plots, merged results), optionally posted as an issue comment. `cli.main` adds it with
`register(subparsers)`; the handler returns an exit code and raises `ReproboxError` for
failures, which `cli.main` turns into one line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from reprobox.cli import options, ui
from reprobox.report.post import PostError, dry_run, parse_target, post, publish_gist


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `report` to the `reprobox` parser."""
    report = subparsers.add_parser(
        "report",
        help="write an upstream-ready report (comment.md, report.md/.html, plots, results)",
    )
    report.add_argument("repro", help="the repro to report on (its results on disk)")
    report.add_argument("--out", type=Path, help="folder (default: results/<repro>/_report)")
    report.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="CELL",
        help="report only these cells: a label or variant, shell patterns allowed (repeatable)",
    )
    report.add_argument(
        "--since", metavar="DATE", help="report only cells run at or after DATE (UTC, ISO)"
    )
    report.add_argument(
        "--post", metavar="OWNER/REPO#N", help="post comment.md as an issue comment with gh"
    )
    report.add_argument(
        "--dry-run",
        action="store_true",
        help="with --post: print exactly what would be posted, post nothing",
    )
    report.add_argument(
        "--edit-last",
        action="store_true",
        help="with --post: replace the previous comment of this report instead of adding one",
    )
    report.add_argument(
        "--as-built",
        action="store_true",
        help="with --post: post the report already in --out (a CI artifact's) as it is, "
        "without rebuilding it from the records",
    )
    report.add_argument(
        "--with-not-run",
        action="store_true",
        help="also list in comment.md the runs that measured nothing (typos, interrupts, "
        "failed installs); report.md and report.html always list them",
    )
    report.add_argument(
        "--no-env",
        action="store_true",
        help="skip the environment reports (transformers env, collect_env, ...)",
    )
    report.set_defaults(handler=cmd_report)


def _progress() -> AbstractContextManager[Any]:
    """A spinner for a person at a terminal; plain lines under CI or in a pipe."""
    if ui.interactive():
        return ui.console.status("report")
    return nullcontext()


def cmd_report(args: argparse.Namespace) -> int:
    # start-up cost: the report modules (matplotlib) load for `reprobox report` only
    from reprobox.report.build import ReportOptions, write_report
    from reprobox.report.data import parse_since

    settings = options.settings(args)
    root = settings.root
    # bad input fails before any work
    target = parse_target(args.post) if args.post else None
    if (args.dry_run or args.edit_last) and target is None:
        raise PostError("--dry-run and --edit-last go with --post OWNER/REPO#N")
    since = parse_since(args.since) if args.since else None
    if args.as_built:
        if target is None:
            raise PostError("--as-built goes with --post OWNER/REPO#N")
        return _post(args, target, _built(args, settings.results))
    wanted = ReportOptions(
        out=args.out,
        results=settings.results,
        collect_env=not args.no_env,
        only=tuple(args.only),
        since=since,
        posting_to=str(target) if target else None,
        step_summary=settings.step_summary,
        ci_run_url=settings.ci_run_url,
        comment_not_run=args.with_not_run,
    )
    with _progress() as status:

        def progress(message: str) -> None:
            if status is not None:
                status.update(message)
            else:
                ui.info(message)

        report = write_report(root, args.repro, wanted, progress)
    for skipped in report.skipped:
        ui.info(f"reprobox: warning: skipped {skipped}")
    extra = f", {report.not_run} not run" if report.not_run else ""
    ui.info(
        f"report: {report.markdown} ({_count(report.records, 'cell')}{extra}, "
        f"{_count(len(report.plots), 'plot')}); "
        f"comment: {report.comment}; html: {report.html}"
    )
    left = [item["name"] for item in _omitted(report)]
    if left and target is None:
        ui.info(
            f"reprobox: warning: comment.md has no room for {', '.join(left)} (GitHub takes "
            "65,536 characters), so as written it does not run: post it with --post, which "
            "publishes them as a secret gist and links it in the comment"
        )
    return _post(args, target, report) if target is not None else 0


def _count(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _built(args: argparse.Namespace, results: Path) -> Any:
    """The report folder `--as-built` posts: --out, or results/<repro>/_report."""
    # start-up cost: the report modules load for `reprobox report` only
    from reprobox.report.build import default_out

    out = (args.out or default_out(results, args.repro)).absolute()
    if not (out / "comment.md").is_file():
        raise PostError(f"--as-built: {out} holds no comment.md written by reprobox report")
    return SimpleNamespace(dir=out, comment=out / "comment.md")


def _post(args: argparse.Namespace, target: Any, report: Any) -> int:
    """Post comment.md (with --dry-run, print it); the files it has no room for go to a
    secret gist first, which it then links."""
    # start-up cost: the report modules load for `reprobox report` only
    from reprobox.report.build import comment_marker

    if args.dry_run:
        body, how = dry_run(target, report.comment, args.edit_last)
        left = _omitted(report)
        if left:
            names = ", ".join(item["name"] for item in left)
            ui.info(
                f"would first publish what the comment has no room for ({names}) as a "
                "secret gist (gh gist create) and link it in the comment"
            )
        ui.info(how)
        sys.stdout.write(body)
        sys.stdout.flush()
        return 0
    _link_omitted_files(report, args.repro)
    url = post(target, report.comment, args.edit_last, comment_marker(args.repro))
    ui.info(f"posted to {target}: {url}" if url else f"posted to {target}")
    return 0


def _link_omitted_files(report: Any, repro: str) -> None:
    """The repro files the comment had no room for go to a secret gist (scrubbed, as the
    comment is), and the comment links it: a maintainer needs them to run what it shows."""
    # start-up cost: the report modules load for `reprobox report` only
    from reprobox.core.scrub import Scrubber
    from reprobox.report.build import with_files_link

    listed = _omitted(report)
    if not listed:
        return
    folder = report.dir / "gist"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    scrub = Scrubber()
    files = []
    for item in listed:  # a gist is flat: fixes/x.py is published as x.py
        path = folder / Path(item["name"]).name
        path.write_text(scrub.text((report.dir / item["path"]).read_text()))
        files.append(path)
    url = publish_gist(files, f"reprobox: files of the {repro} reproduction")
    text = report.comment.read_text()
    report.comment.write_text(with_files_link(text, url, [i["name"] for i in listed]))


def _omitted(report: Any) -> list[dict[str, str]]:
    """The files the written comment left out (name shown, path), from the report folder."""
    # start-up cost: the report modules load for `reprobox report` only
    from reprobox.report.build import OMITTED_FILE

    omitted = report.dir / OMITTED_FILE
    return list(json.loads(omitted.read_text())) if omitted.is_file() else []
