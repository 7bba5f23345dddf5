"""Commands for running cells elsewhere and bringing their results home: `k8s`, `collect`,
`newest`, `ci-matrix`, `canary-plan`, and the corpus campaign, `corpus`. `cli.main` adds them
with `register(subparsers)`; each handler returns an exit code and raises `ReproboxError` for
failures, which `cli.main` turns into one line.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from reprobox.cli import options, ui
from reprobox.core import spec
from reprobox.core.errors import BadInput
from reprobox.core.records import RecordStore
from reprobox.core.settings import Settings
from reprobox.run import pushes
from reprobox.run.pipeline import lock_for

if TYPE_CHECKING:  # imported where used: the index's HTTP client and YAML are off the run path
    from reprobox.envs.index import IndexAxes
    from reprobox.scaleout import jobs
    from reprobox.scaleout.corpus import Reply


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the scale-out subcommands to the `reprobox` parser."""
    kube = subparsers.add_parser(
        "k8s",
        help="a Kubernetes Indexed Job (YAML) running one pod per cell",
        description="One pod per cell, each running its variant's image by digest (pushed "
        "with `nox -s image -- REPRO --variant V --push REGISTRY`) and writing to "
        "/out/<repro>/<cell> on a shared claim. Needs Kubernetes 1.29 or newer; pods meet "
        "Pod Security 'restricted'. `--collector` prints a pod to `kubectl cp` the outputs.",
    )
    kube.add_argument("repro", help="the repro whose cells become pods")
    kube.add_argument(
        "--registry",
        "--image-prefix",
        dest="registry",
        help="use the images pushed to this registry (default: the newest push of each)",
    )
    kube.add_argument(
        "--image",
        help="one explicit image for every cell (then a single Job); use a digest. Refused "
        "when the cells need more than one environment (variants or packages with other pins)",
    )
    kube.add_argument(
        "--image-for-all",
        action="store_true",
        help="with --image: put it on every cell even where the cell's pins differ (each such "
        "cell then measures the image's packages, not its own)",
    )
    kube.add_argument("--out", type=Path, help="write the YAML here (default: stdout)")
    kube.add_argument(
        "--cells",
        choices=["default", "matrix", "all"],
        default="all",
        help="which cells: the default ones, the [matrix], or both (default: all)",
    )
    options.add(kube, "platform")
    kube.add_argument("--claim", default="reprobox-results", help="PVC mounted at /out")
    kube.add_argument("--namespace", help="the Kubernetes namespace (default: the context's)")
    kube.add_argument(
        "--parallelism", type=options.positive_int, help="pods at once per Job (default: all)"
    )
    kube.add_argument("--cpu", help="CPU of each pod, e.g. 8 or 500m (default: one per rank)")
    kube.add_argument(
        "--memory", help="memory of each pod, e.g. 32Gi (default: 4Gi per rank + /dev/shm)"
    )
    kube.add_argument(
        "--shm",
        type=options.positive_int,
        default=1,
        metavar="GIB",
        help="/dev/shm of each pod (default: 1)",
    )
    kube.add_argument(
        "--ttl",
        type=options.natural_int,
        default=7 * 86400,
        metavar="SECONDS",
        help="delete the finished Job and its pods after this (default: 7 days)",
    )
    kube.add_argument(
        "--collector",
        action="store_true",
        help="print instead a pod that mounts the claim read-only, for `kubectl cp`",
    )
    kube.set_defaults(handler=cmd_k8s)

    collect = subparsers.add_parser(
        "collect", help="import per-cell outputs (k8s /out tree, copied results) as records"
    )
    collect.add_argument(
        "source", type=Path, help="a folder of per-cell outputs (a pod's /out, copied results)"
    )
    collect.set_defaults(handler=cmd_collect)

    newest = subparsers.add_parser(
        "newest", help="print the newest release of a package (of each, with --as-pins)"
    )
    newest.add_argument(
        "packages",
        nargs="+",
        metavar="PACKAGE",
        help="a package name on the index (e.g. transformers)",
    )
    newest.add_argument("--pre", action="store_true", help="allow pre-releases")
    newest.add_argument(
        "--as-pins",
        action="store_true",
        help="print NAME==VERSION for each package, on one line (the canary's --with pins)",
    )
    newest.set_defaults(handler=cmd_newest)

    matrix = subparsers.add_parser(
        "ci-matrix", help="turn `nox --json -l` output into GitHub Actions job matrices"
    )
    matrix.add_argument("listing", type=Path, help="the JSON nox printed ('-' for stdin)")
    matrix.set_defaults(handler=cmd_ci_matrix)

    canary = subparsers.add_parser(
        "canary-plan", help="(repro, package, variant) entries for the nightly canary, as JSON"
    )
    canary.set_defaults(handler=cmd_canary_plan)

    corpus = subparsers.add_parser(
        "corpus",
        help="ask every corpus repro the questions its [truth] answers; grade the answers",
        description="For each corpus repro (a repro with a [truth]): its default verdicts, a "
        "release bisect over a range holding the breaking edge, a sweep over both edges (a "
        "noisy case with a [truth] last_bad: a sweep of each edge), and where the culprit is "
        "another package, the attribution; each asked through this CLI with --json and graded "
        "against the truth (right, an "
        "honest refusal, or wrong). Writes the table and totals as Markdown. Measured probes "
        "are reused (each bisect and sweep resumes from its log). Exit 1 when any answer is "
        "wrong.",
    )
    corpus.add_argument("repros", nargs="*", help="corpus repros (default: all of them)")
    corpus.add_argument("--out", type=Path, help="the Markdown (default: docs/corpus.md)")
    corpus.add_argument(
        "--cases", type=options.positive_int, default=1, metavar="K",
        help="cases asked at once (default 1)",
    )  # fmt: skip
    corpus.add_argument(
        "--questions", type=_question_kinds, default=None, metavar="KIND[,KIND]",
        help="ask only these kinds (verdicts, bisect, sweep, attribution; default: all); "
        "the command in the Markdown's header says which",
    )  # fmt: skip
    corpus.set_defaults(handler=cmd_corpus)


def _question_kinds(text: str) -> frozenset[str]:
    # start-up cost: the campaign loads only when the flag is given
    from reprobox.scaleout.corpus import KINDS

    kinds = frozenset(k.strip() for k in text.split(",") if k.strip())
    unknown = sorted(kinds - set(KINDS))
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(
            f"{', '.join(unknown) or 'nothing'}: a kind is one of {', '.join(KINDS)}"
        )
    return kinds


def _axes(args: argparse.Namespace) -> IndexAxes:
    # start-up cost: the package index client loads when one is asked
    from reprobox.envs.index import IndexAxes, SimpleIndex

    return IndexAxes(SimpleIndex.from_settings(options.settings(args)))


def cmd_k8s(args: argparse.Namespace) -> int:
    # start-up cost: the scale-out modules load for their commands only
    from reprobox.scaleout import jobs, k8s

    settings = options.settings(args)
    cells = jobs.job_cells(settings.root, args.repro, args.cells, args.platform, _axes(args))
    if args.image_for_all and not args.image:
        raise BadInput("--image-for-all goes with --image IMAGE")
    pods = k8s.K8sOptions(
        image=args.image,
        image_for_all=args.image_for_all,
        claim=args.claim,
        namespace=args.namespace,
        parallelism=args.parallelism,
        cpu=args.cpu,
        memory=args.memory,
        shm_gi=args.shm,
        ttl_s=args.ttl,
    )
    images = {} if args.image else pushed_images(settings, args.repro, cells, args.registry)
    if args.image and not k8s.is_digest_reference(args.image):
        ui.info(
            f"reprobox: warning: --image {args.image} is a tag, which can move; "
            "name it by digest (NAME@sha256:...) so every pod runs the same bytes"
        )
    if args.collector:
        image = args.image or images[cells[0].index]
        objects = [k8s.collector(args.repro, image, pods), k8s.network_policy(args.repro, pods)]
    else:
        environments = k8s.cell_environments(spec.load(settings.root, args.repro), cells)
        objects = k8s.manifest(cells, images, pods, environments)
        kinds = len(set(environments.values()))
        if args.image and kinds > 1:  # --image-for-all: asked for, and said
            ui.info(
                f"reprobox: warning: --image-for-all: {len(cells)} cells of {kinds} "
                f"environments all run {args.image}; a cell whose pins the image lacks "
                "measures the image's packages, not its own"
            )
    text = k8s.dump(objects)
    if args.out is None:
        sys.stdout.write(text)
        return 0
    if args.out.exists():
        raise BadInput(f"{args.out} exists; choose another --out (nothing is overwritten)")
    args.out.write_text(text)
    what = "a collector pod" if args.collector else f"{len(cells)} cells"
    ui.info(f"{args.out}: {what}; `kubectl apply -f {args.out}`")
    return 0


def pushed_images(
    settings: Settings, name: str, cells: list[jobs.JobCell], registry: str | None
) -> dict[int, str]:
    """Each cell's image by digest, from the push records: the image its lock, Dockerfile
    and repro files make now (the same content hash `nox -s image` tags it with), as pushed.
    A cell whose current image was never pushed is an error naming the command to push it."""
    # start-up cost: the container back end loads when chosen only
    from reprobox.run.backends.container import image_spec

    repro = spec.load(settings.root, name)
    records = pushes.load(settings.results, name)
    images: dict[int, str] = {}
    for cell in cells:
        lock = lock_for(repro, cell.variant, cell.platform, cell.packages, settings=settings)
        tag = image_spec(settings.root, repro, cell.variant, cell.platform, lock).tag
        found = pushes.find(records, tag, registry)
        if found is None:
            command = shlex.join(
                ["nox", "-s", "image", "--", name, *cell.run_args, "--push", registry or "REGISTRY"]
            )
            older = any(p.variant == cell.variant and p.platform == cell.platform
                        and p.in_registry for p in records)  # fmt: skip
            why = (
                " (an older build was: the repro, its lock or its Dockerfile changed since)"
                if older
                else ""
            )
            to = f" to {registry}" if registry else ""
            raise BadInput(f"{cell.label}: image {tag} was never pushed{to}{why}; run `{command}`")
        images[cell.index] = found.reference
    return images


def cmd_collect(args: argparse.Namespace) -> int:
    # start-up cost: the scale-out modules load for their commands only
    from reprobox.scaleout.collect import collect

    settings = options.settings(args)
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
    """The newest non-yanked release (pre-releases only with --pre), for the canary: the
    bare version of one package, or NAME==VERSION of each with --as-pins."""
    # start-up cost: the package index client loads when one is asked
    from reprobox.envs.index import SimpleIndex, select

    if len(args.packages) > 1 and not args.as_pins:
        raise BadInput("newest: several packages need --as-pins (NAME==VERSION each)")
    index = SimpleIndex.from_settings(options.settings(args))
    found = []
    for package in args.packages:
        versions = select(index.releases(package), "", prereleases=args.pre)
        if not versions:
            raise BadInput(f"{package} has no release to test")
        found.append(f"{package}=={versions[-1]}" if args.as_pins else str(versions[-1]))
    print(" ".join(found))
    return 0


def cmd_ci_matrix(args: argparse.Namespace) -> int:
    """Prints `cpu=...`, `gpu=...`, `repros=...` lines for $GITHUB_OUTPUT."""
    # start-up cost: the scale-out modules load for their commands only
    from reprobox.scaleout import jobs

    text = sys.stdin.read() if str(args.listing) == "-" else _read(args.listing)
    try:
        listed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(f"{args.listing}: not the JSON of `nox --json -l` ({exc.msg})") from None
    if not isinstance(listed, list):
        raise BadInput(f"{args.listing}: not the JSON of `nox --json -l` (want a list)")
    found = jobs.github_matrix(options.settings(args).root, listed, _axes(args))
    for key, value in found.items():
        print(f"{key}={json.dumps(value, separators=(',', ':'))}")
    return 0


def cmd_canary_plan(args: argparse.Namespace) -> int:
    # start-up cost: the scale-out modules load for their commands only
    from reprobox.scaleout import jobs

    plan = jobs.canary_plan(options.settings(args).root)
    print(f"include={json.dumps(plan, separators=(',', ':'))}")
    return 0


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise BadInput(f"{path}: {exc.strerror}") from None


def cmd_corpus(args: argparse.Namespace) -> int:
    # start-up cost: the campaign (and its thread pool) is loaded only when asked for
    from reprobox.scaleout import corpus

    root = options.settings(args).root
    names = args.repros or [n for n in spec.discover(root) if spec.load(root, n).corpus]
    repros = [spec.load(root, name) for name in names]
    not_corpus = [r.name for r in repros if not r.corpus]
    if not_corpus:
        raise BadInput(f"not corpus repros (no [truth]): {', '.join(not_corpus)}")
    if not repros:
        raise BadInput("no corpus repro (a repro with a [truth]) under repros/")
    kinds = args.questions or frozenset(corpus.KINDS)
    cases = [corpus.questions(r, kinds) for r in repros]
    asker = _Asker()
    asked = corpus.ask_cases(cases, asker.ask, args.cases, on_interrupt=asker.stop)
    out = args.out or root / "docs" / "corpus.md"
    command = "reprobox corpus" + "".join(f" {n}" for n in args.repros)
    if args.questions:
        command += " --questions " + ",".join(k for k in corpus.KINDS if k in kinds)
    out.write_text(corpus.markdown(asked, command))
    wrong = [a for a in asked if a.grade == "wrong"]
    for answer in asked:
        q = answer.question
        print(f"{q.case} {q.label}: {answer.grade}: {answer.line} ({answer.why})")
    print(f"corpus: {len(asked)} questions, {len(wrong)} answered wrong; table in {out}")
    return 1 if wrong else 0


class _Asker:
    """Asks the campaign's questions, one `reprobox` process each, and stops them on an
    interrupt. Each runs in a session of its own, so a Ctrl-C in the terminal reaches only
    the campaign, which passes exactly that signal on (SIGINT, or the SIGTERM or SIGHUP it
    got) to every question still running: each cleans up as `reprobox` does (its ranks
    killed, what it measured kept) and ends; no later question starts."""

    def __init__(self) -> None:
        self._lock = threading.Condition()  # notified whenever a question ends
        self._running: dict[subprocess.Popen[str], int] = {}  # each with its pidfd
        self._stopped: int | None = None  # the signal passed on, once stopped

    def stop(self, exc: BaseException) -> None:
        signum = int(getattr(exc, "signum", signal.SIGINT))
        with self._lock:
            self._stopped = signum
            for pidfd in self._running.values():  # a pidfd: never a recycled pid
                try:
                    signal.pidfd_send_signal(pidfd, signum)
                except OSError:
                    pass  # it has just ended
            # then wait for them: each cleans up (its ranks killed) before the campaign ends
            self._lock.wait_for(lambda: not self._running)

    def ask(self, arguments: Sequence[str]) -> Reply:
        """One `reprobox` call: its JSON (stdout), its exit code, the CPU of its whole tree
        (`wait4`: the child's rusage holds every descendant it waited for, which the
        harness does for every rank) and its wall time; its progress goes on to stderr as
        it comes."""
        from reprobox.scaleout.corpus import Reply  # start-up cost: only for the campaign

        started = time.monotonic()
        with self._lock:
            if self._stopped is not None:
                return Reply(code=128 + self._stopped, data=None, cpu_s=0.0, wall_s=0.0,
                             error="not asked: the campaign was interrupted")  # fmt: skip
            proc = subprocess.Popen([sys.executable, "-m", "reprobox", *arguments],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, start_new_session=True)  # fmt: skip
            self._running[proc] = os.pidfd_open(proc.pid)
        out: list[str] = []
        err: list[str] = []

        def read_out() -> None:
            assert proc.stdout is not None
            out.append(proc.stdout.read())

        def read_err() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                err.append(line)
                sys.stderr.write(line)

        readers = [threading.Thread(target=read_out), threading.Thread(target=read_err)]
        for reader in readers:
            reader.start()
        _, status, usage = os.wait4(proc.pid, 0)
        with self._lock:
            proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
            os.close(self._running.pop(proc))
            self._lock.notify_all()
        for reader in readers:
            reader.join()
        text = "".join(out)
        try:
            data = json.loads(text) if text.strip() else None
        except json.JSONDecodeError:
            data = None
        last = err[-1].strip() if err else ""
        return Reply(code=proc.returncode, data=data, cpu_s=usage.ru_utime + usage.ru_stime,
                     wall_s=time.monotonic() - started, error=last)  # fmt: skip
