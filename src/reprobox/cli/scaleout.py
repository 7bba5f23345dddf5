"""Commands for running cells elsewhere and bringing their results home: `k8s`, `collect`,
`newest`, `ci-matrix`, `canary-plan`. `cli.main` adds them with `register(subparsers)`; each
handler returns an exit code and raises `ReproboxError` for failures, which `cli.main` turns
into one line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from reprobox.cli import ui
from reprobox.core.errors import BadInput
from reprobox.core.settings import Settings
from reprobox.envs.index import IndexAxes, SimpleIndex, select
from reprobox.scaleout import jobs, k8s


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the scale-out subcommands to the `reprobox` parser."""
    kube = subparsers.add_parser(
        "k8s", help="a Kubernetes Indexed Job (YAML) running one pod per cell"
    )
    kube.add_argument("repro", help="the repro whose cells become pods")
    kube.add_argument("--image-prefix", default="reprobox", help="images are PREFIX/<repro>:TAG")
    kube.add_argument("--image", help="one image for every cell (then a single Job)")
    kube.add_argument("--out", type=Path, help="write the YAML here (default: stdout)")
    kube.add_argument(
        "--cells",
        choices=["default", "matrix", "all"],
        default="all",
        help="which cells: the default ones, the [matrix], or both (default: all)",
    )
    kube.add_argument("--platform", default="gpu", help="platform of repro.toml (default: gpu)")
    kube.add_argument("--claim", default="reprobox-results", help="PVC mounted at /out")
    kube.add_argument("--namespace", help="the Kubernetes namespace (default: the context's)")
    kube.add_argument("--parallelism", type=int, help="pods at once per Job (default: all)")
    kube.set_defaults(handler=cmd_k8s)

    collect = subparsers.add_parser(
        "collect", help="import per-cell outputs (k8s /out tree, copied results) as records"
    )
    collect.add_argument(
        "source", type=Path, help="a folder of per-cell outputs (a pod's /out, copied results)"
    )
    collect.set_defaults(handler=cmd_collect)

    newest = subparsers.add_parser("newest", help="print the newest release of a package")
    newest.add_argument("package", help="a package name on the index (e.g. transformers)")
    newest.add_argument("--pre", action="store_true", help="allow pre-releases")
    newest.set_defaults(handler=cmd_newest)

    matrix = subparsers.add_parser(
        "ci-matrix", help="turn `nox --json -l` output into GitHub Actions job matrices"
    )
    matrix.add_argument("listing", type=Path, help="the JSON nox printed ('-' for stdin)")
    matrix.set_defaults(handler=cmd_ci_matrix)

    canary = subparsers.add_parser(
        "canary-plan", help="(repro, package) pairs for the nightly canary, as JSON"
    )
    canary.set_defaults(handler=cmd_canary_plan)


def _settings(args: argparse.Namespace) -> Settings:
    return getattr(args, "settings", None) or Settings.from_env()


def _axes(args: argparse.Namespace) -> IndexAxes:
    return IndexAxes(SimpleIndex.from_settings(_settings(args)))


def cmd_k8s(args: argparse.Namespace) -> int:
    root = _settings(args).root
    cells = jobs.job_cells(root, args.repro, args.cells, args.platform, _axes(args))
    options = k8s.K8sOptions(
        image_prefix=args.image_prefix,
        image=args.image,
        claim=args.claim,
        namespace=args.namespace,
        parallelism=args.parallelism,
    )
    text = k8s.dump(k8s.manifest(cells, options))
    if args.out is None:
        sys.stdout.write(text)
        return 0
    if args.out.exists():
        raise BadInput(f"{args.out} exists; choose another --out (nothing is overwritten)")
    args.out.write_text(text)
    ui.info(f"{args.out}: {len(cells)} cells; `kubectl apply -f {args.out}`")
    return 0


def cmd_collect(args: argparse.Namespace) -> int:
    from reprobox.core.records import RecordStore
    from reprobox.scaleout.collect import collect

    settings = _settings(args)
    found = collect(args.source, settings.root, RecordStore(settings.results))
    for record in found.records:
        ui.record_line(record)
    for skipped in found.skipped:
        ui.info(f"reprobox: warning: not imported {skipped}")
    if not found.records:
        raise BadInput(f"nothing imported from {args.source}: {found.skipped[0]}")
    ui.info(f"collected {len(found.records)} records, {len(found.skipped)} not imported")
    return 0


def cmd_newest(args: argparse.Namespace) -> int:
    """The newest non-yanked release (pre-releases only with --pre), for the canary."""
    index = SimpleIndex.from_settings(_settings(args))
    versions = select(index.releases(args.package), "", prereleases=args.pre)
    if not versions:
        raise BadInput(f"{args.package} has no release to test")
    print(versions[-1])
    return 0


def cmd_ci_matrix(args: argparse.Namespace) -> int:
    """Prints `cpu=...`, `gpu=...`, `repros=...` lines for $GITHUB_OUTPUT."""
    text = sys.stdin.read() if str(args.listing) == "-" else _read(args.listing)
    try:
        listed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(f"{args.listing}: not the JSON of `nox --json -l` ({exc.msg})") from None
    if not isinstance(listed, list):
        raise BadInput(f"{args.listing}: not the JSON of `nox --json -l` (want a list)")
    found = jobs.github_matrix(_settings(args).root, listed, _axes(args))
    for key, value in found.items():
        print(f"{key}={json.dumps(value, separators=(',', ':'))}")
    return 0


def cmd_canary_plan(args: argparse.Namespace) -> int:
    plan = jobs.canary_plan(_settings(args).root)
    print(f"include={json.dumps(plan, separators=(',', ':'))}")
    return 0


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise BadInput(f"{path}: {exc.strerror}") from None
