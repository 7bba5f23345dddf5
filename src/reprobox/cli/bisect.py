"""`bisect` and `sweep`: search a package's releases, the stack's days or a package's commits
for where a variant's verdict flips, or map every release in a range. `cli.main` adds them
with `register(subparsers)`."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING, Any

from reprobox.cli import cells, options, ui
from reprobox.cli.progress import BisectProgress
from reprobox.core import spec
from reprobox.core.errors import BadInput, ExitCode

if TYPE_CHECKING:
    from reprobox.bisect.axes import Axis
    from reprobox.bisect.plan import PlanOutput as Plan
    from reprobox.bisect.prober import Target
    from reprobox.bisect.strategy import Strategy
    from reprobox.bisect.summary import BisectSummary

_DAY = " to find the day, then a few to narrow its package changes"
_SHOWN_ENDS = 6  # a plan's candidates shown at each end of a long range
_SEARCH = ("package", "variant", "packages", "editables", "log", "platform", "timeout")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `bisect` and `sweep` to the `reprobox` parser."""
    bisect = subparsers.add_parser(
        "bisect",
        help="find the release (or date) where a variant's verdict flips",
        description="Binary-search the releases of one package (or the days of the stack's "
        "history) for where a variant's verdict flips. The answer says what it assumed (one "
        "change between the ends) and is checked against extra probes (--verify) and every "
        "verdict already on disk; a contradiction makes it non-monotone (exit 1), never found.",
    )
    bisect.add_argument("repro", help="the repro to bisect (see `reprobox list`)")
    options.add(bisect, *_SEARCH, "good", "bad", "confirm", "verify")
    options.add(bisect, "flaky", "confidence", "max_runs", "min_shift")
    bisect.add_argument(
        "--by-date", metavar="START..END", help="bisect over days (UTC) instead of releases"
    )
    options.add(bisect, "float")
    bisect.add_argument(
        "--commits",
        action="store_true",
        help="bisect the package's git history (--good/--bad are refs; without them, the "
        "release tags around a finished release bisect of this repro)",
    )
    bisect.add_argument(
        "--repo",
        metavar="URL_OR_PATH",
        help="with --commits: the package's repository (default: the Source URL its "
        "installed metadata names)",
    )
    bisect.add_argument(
        "--tag-format",
        metavar="FORMAT",
        help="with --commits: how release tags are spelled, e.g. 'release-{version}' "
        "(default: v{version} or {version})",
    )
    bisect.add_argument(
        "--first-parent",
        type=options.boolean,
        nargs="?",
        const=True,
        default=True,
        metavar="BOOL",
        help="with --commits: walk the first-parent history only (default true: a merged "
        "pull request is one step); false descends into a merge to the commit inside it",
    )
    options.add(bisect, "workers", *options.BACKEND, "json")
    bisect.add_argument(
        "--dry-run",
        action="store_true",
        help="print the candidates, the ends it would check and the expected number of "
        "probes, and launch nothing (releases and dates)",
    )
    bisect.set_defaults(handler=cmd_bisect)

    sweep = subparsers.add_parser(
        "sweep",
        help="probe every release in a range and print the affected versions",
        description="Probe every release of one package in a range (yanked ones too, marked) "
        "and print where the variant reproduces as advisory-style ranges "
        "(`>=4.44.2,<4.46.0; ==4.47.0`) with introduced / fixed events. Assumes nothing "
        "about how often the verdict changes.",
    )
    sweep.add_argument("repro", help="the repro to sweep (see `reprobox list`)")
    sweep.add_argument(
        "--range",
        required=True,
        metavar="SPEC",
        help="the releases, e.g. '>=4.44.2,<=4.49.0' or 4.44.2..4.49.0 (both ends in)",
    )
    options.add(sweep, *_SEARCH, "workers", *options.BACKEND, "json")
    sweep.set_defaults(handler=cmd_sweep)


def _target(args: argparse.Namespace) -> tuple[Target, spec.BisectSection | None]:
    """The repro and variant every probe runs, from the flags or [bisect], and the other
    packages every probe runs at (--with, --with-editable)."""
    from reprobox.bisect.prober import Target  # bisects only: a run need not import it

    settings = options.settings(args)
    repro = spec.load(settings.root, args.repro)
    defaults = repro.spec.bisect
    if len(args.variant) > 1:
        raise BadInput(f"a {args.command} runs one --variant, not {len(args.variant)}")
    variant = args.variant[0] if args.variant else (defaults.variant if defaults else None)
    if variant is None:
        raise BadInput(f"--variant is needed: {repro.name} has no [bisect] variant")
    repro.variant(variant)
    target = Target(
        repro,
        variant,
        cells.run_options(args),
        settings,
        cells.backend(args),
        overrides=cells.overrides(args),
    )
    return target, defaults


def cmd_bisect(args: argparse.Namespace) -> int:
    # start-up cost: the bisect modules load for a bisect only
    from reprobox.bisect import commits, dates, releases

    target, defaults = _target(args)
    if not args.commits and (args.repo or args.tag_format or args.first_parent is not True):
        raise BadInput("--repo, --tag-format and --first-parent go with --commits")
    strategy = _strategy(args, target)
    if args.commits and args.by_date:
        raise BadInput("--commits and --by-date are two kinds of bisect: pick one")
    if strategy.flaky:  # every probe one launch: the posterior weighs each (docs/noise.md)
        target = dataclasses.replace(target, one_launch=True, metric=strategy.metric)
    if args.dry_run:
        return _dry_run(args, target, defaults, strategy)
    with BisectProgress(target.repro.name) as progress:
        if args.commits:
            package = args.package or (defaults.package if defaults else None)
            if not package:
                raise BadInput("--package is needed (no [bisect] package)")
            summary = commits.commit_bisect(
                target,
                package,
                repo=args.repo,
                good=args.good,
                bad=args.bad,
                tag_format=args.tag_format,
                first_parent=args.first_parent,
                log_path=args.log,
                on_probe=progress.probe,
                strategy=strategy,
            )
        elif args.by_date:
            start, end = dates.parse_dates(args.by_date)
            floats = args.float or (defaults.float or [defaults.package] if defaults else [])
            summary = dates.date_bisect(
                target,
                start,
                end,
                floats,
                index=cells.index(args),
                log_path=args.log,
                on_probe=progress.probe,
                strategy=strategy,
            )
        else:
            package, good, bad = _release_ends(args, defaults)
            summary = releases.release_bisect(
                target,
                package,
                good,
                bad,
                cells.index(args),
                log_path=args.log,
                on_probe=progress.probe,
                strategy=strategy,
            )
    # Only "found" and "ambiguous" are answers; flaky, non-monotone, undecided and no-change
    # histories name no boundary.
    code = int(ExitCode.OK if summary.status in ("found", "ambiguous") else ExitCode.FAILED)
    _say(args, summary, code)
    return code


def _say(args: argparse.Namespace, summary: BisectSummary, code: int) -> None:
    """The summary: its closing lines, or with --json the document (the progress was on
    stderr either way)."""
    if args.json:
        # start-up cost: --json only (it loads the bisect summary's models)
        from reprobox.cli import jsonout

        jsonout.search(args.command, summary, code)
    else:
        ui.bisect_summary(summary)


def _release_ends(
    args: argparse.Namespace, defaults: spec.BisectSection | None
) -> tuple[str, str, str]:
    """The package, good and bad release of a release bisect: the flags, else [bisect]."""
    package = args.package or (defaults.package if defaults else None)
    good = args.good or (defaults.good if defaults else None)
    bad = args.bad or (defaults.bad if defaults else None)
    if not (package and good and bad):
        raise BadInput("--package, --good and --bad are needed (no [bisect] defaults)")
    for name, value in (("--good", good), ("--bad", bad)):
        spec.check_version(value, name)
    return package, good, bad


def _dry_run(
    args: argparse.Namespace,
    target: Target,
    defaults: spec.BisectSection | None,
    strategy: Strategy,
) -> int:
    """The plan of this bisect (`bisect.plan`), printed; nothing is launched, exit 0."""
    # start-up cost: the bisect modules load for a bisect only
    from reprobox.bisect import dates, plan, releases

    if args.commits:
        raise BadInput("--dry-run plans a bisect of releases or dates, not --commits")
    axis: Axis[Any]
    if args.by_date:
        start, end = dates.parse_dates(args.by_date)
        floats = args.float or (defaults.float or [defaults.package] if defaults else [])
        target, axis = dates.date_axis(target, start, end, floats, index=cells.index(args))
    else:
        package, good, bad = _release_ends(args, defaults)
        target, axis = releases.release_axis(target, package, good, bad, cells.index(args))
    found = plan.plan(axis, strategy, target.repro.name, target.variant, target.options.platform)
    if args.json:
        # start-up cost: --json only (it loads the bisect summary's models)
        from reprobox.cli import jsonout

        jsonout.plan(found)
    else:
        _show_plan(found)
    return int(ExitCode.OK)


def _show_plan(found: Plan) -> None:
    """The plan in words, on stdout: the candidates (yanked ones marked), the ends, the
    probes it expects and how they were counted."""
    marked = [f"{c} (yanked)" if c in found.yanked else c for c in found.candidates]
    if len(marked) > 2 * _SHOWN_ENDS + 1:  # all of them: --json
        hidden = len(marked) - 2 * _SHOWN_ENDS
        marked = [*marked[:_SHOWN_ENDS], f"... {hidden} more ...", *marked[-_SHOWN_ENDS:]]
    yanked = f", {len(found.yanked)} yanked" if found.yanked else ""
    noun = {"release": "releases", "date": "days"}.get(found.kind, found.kind + "s")
    bound = "about" if found.estimate else "at most"
    lines = [
        f"bisect {found.repro} --variant {found.variant} ({found.platform}): "
        f"{len(found.candidates)} {noun}{yanked}: {', '.join(marked)}",
        f"ends it checks first: {found.ends[0]} and {found.ends[1]}",
        f"expected probes: {bound} {found.probes}{_DAY * (found.kind == 'date')} "
        f"({found.strategy}; {found.rule})",
        "nothing launched (--dry-run)",
    ]
    for line in lines:
        ui.out.print(line, markup=False, soft_wrap=True, highlight=False)


def _strategy(args: argparse.Namespace, target: Target) -> Strategy:
    """How this bisect searches (--flaky defaults to on for a repro that declares repeats);
    BadInput (exit 2) for a flag out of its range."""
    from reprobox.bisect import strategy as how  # bisects only

    flaky = how.declares_noise(target.repro, target.variant) if args.flaky is None else args.flaky
    metric = how.declared_metric(target.repro, target.variant) if flaky else None
    strategy = how.Strategy(
        confirm=args.confirm,
        verify=args.verify,
        workers=args.workers,
        flaky=flaky,
        confidence=args.confidence,
        max_runs=how.DEFAULT_MAX_RUNS if args.max_runs is None else args.max_runs,
        metric=metric,
        min_shift=args.min_shift,
    ).check()
    if args.max_runs is None and metric:  # --min-shift is checked: the budget it takes
        return dataclasses.replace(strategy, max_runs=how.metric_budget(strategy.min_shift))
    return strategy


def cmd_sweep(args: argparse.Namespace) -> int:
    # start-up cost: the bisect modules load for a bisect only
    from reprobox.bisect import sweep
    from reprobox.bisect.strategy import Strategy
    from reprobox.envs.index import version_range  # urllib and http: only a sweep needs them

    version_range(args.range)  # a bad --range is said before the index is asked
    target, defaults = _target(args)
    package = args.package or (defaults.package if defaults else None)
    if not package:
        raise BadInput("--package is needed (no [bisect] package)")
    with BisectProgress(target.repro.name, verb="sweeping") as progress:
        summary = sweep.sweep(
            target,
            package,
            args.range,
            cells.index(args),
            log_path=args.log,
            on_probe=progress.probe,
            strategy=Strategy(workers=args.workers),
        )
    _say(args, summary, int(ExitCode.OK))
    return int(ExitCode.OK)
