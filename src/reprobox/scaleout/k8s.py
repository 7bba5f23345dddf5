"""Run a repro's cells as a Kubernetes Indexed Job, and import what the pods wrote.

One pod per cell: the Job runs with `completionMode: Indexed`, a ConfigMap holds the cells as
JSON, and each pod picks its cell by `JOB_COMPLETION_INDEX`, runs the repro's image with that
cell's launcher and arguments, and leaves `cell.json`, `result.json`, `launch.log` and
`exit_code` in `/out/<repro>/<cell slug>/` on a shared volume: the results folder's own shape,
so the cells of different repros never meet on one claim. A pod template has one image, so
cells that need different environments (variant, package versions) go to one Job each.

Images are named by digest (`REGISTRY/<repro>@sha256:...`, recorded by `nox -s image -- ...
--push REGISTRY`, run/pushes.py): a tag can move between the push and the pod's start.

Pods are confined to the Pod Security "restricted" level: a non-root user (the image's),
no privilege escalation, every capability dropped, the runtime's seccomp profile, a read-only
root (the image writes only /out, /cache and /tmp, each a volume), bounded CPU, memory and
/dev/shm, no service-account token, and the Job deleted a while after it ends.

Needs Kubernetes 1.29 or newer: `backoffLimitPerIndex` and `maxFailedIndexes` (one cell's
failure never fails its neighbours) are beta and on by default from 1.29, GA in 1.33.

`reprobox collect` (scaleout/collect.py) turns such a tree into records under results/.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from reprobox.core import spec
from reprobox.core.counts import check_count
from reprobox.core.errors import BadInput
from reprobox.core.protocol import CACHE_ENV
from reprobox.run.layout import CACHE, IMAGE_UID, OUT
from reprobox.scaleout.jobs import JobCell

MIN_KUBERNETES = "1.29"  # backoffLimitPerIndex / maxFailedIndexes on by default (beta)
CELLS_KEY = "cells.json"
CELLS_MOUNT = "/etc/reprobox"
OUT_MOUNT = str(OUT)
CELL_FILE = "cell.json"
EXIT_FILE = "exit_code"
STARTED_KEY = "started_at"  # set by the pod in its cell.json: copies do not keep mtimes
VERDICT_EXIT_CODES = (0, 1, 125)
DEADLINE_MARGIN_S = 300  # image pull and start-up on top of [launch] timeout
INDEX_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
CONFIG_MAP_LIMIT = 1024 * 1024  # bytes a ConfigMap may hold
MEMORY_PER_PROCESS_GI = 4  # a pod's default memory: per rank, plus its /dev/shm
COLLECTOR_S = 3600  # how long a collector pod waits for `kubectl cp`
DIGEST_REF = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")
NO_NAMESPACE = "no --namespace given: the kubectl context's namespace is used"

# What each pod runs, with the image's own Python: pick the cell, run it, keep its output.
# A verdict (0 clean, 1 reproduced, 125 cannot test) is a successful pod; anything else fails
# it, so Kubernetes retries that index and the Job's status shows the error.
POD_SCRIPT = f"""\
import json, os, subprocess, sys, time
index = int(os.environ["JOB_COMPLETION_INDEX"])
with open("{CELLS_MOUNT}/{CELLS_KEY}") as f:
    cell = json.load(f)[index]
out = os.path.join("{OUT_MOUNT}", cell["repro"], cell["slug"])
os.makedirs(out, exist_ok=True)
for stale in ("result.json", "{EXIT_FILE}"):
    if os.path.lexists(os.path.join(out, stale)):
        os.remove(os.path.join(out, stale))
cell["{STARTED_KEY}"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
with open(os.path.join(out, "{CELL_FILE}"), "w") as f:
    json.dump(cell, f, indent=2)
env = {{**os.environ, **cell["env"], "REPRO_RESULT": os.path.join(out, "result.json")}}
argv = cell["launch"] + cell["args"]
with open(os.path.join(out, "launch.log"), "wb") as log:
    log.write(("$ " + " ".join(argv) + "\\n").encode())
    log.flush()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    for line in proc.stdout:
        sys.stdout.buffer.write(line)
        sys.stdout.flush()
        log.write(line)
code = proc.wait()
with open(os.path.join(out, "{EXIT_FILE}"), "w") as f:
    f.write(f"{{code}}\\n")
sys.exit(0 if code in {VERDICT_EXIT_CODES} else (code or 1))
"""


@dataclass(frozen=True)
class K8sOptions:
    image: str | None = None  # one image holding every cell's environment: one Job in all
    image_for_all: bool = False  # put `image` on cells of other environments too (said so)
    claim: str = "reprobox-results"  # a ReadWriteMany PersistentVolumeClaim mounted at /out
    namespace: str | None = None
    parallelism: int | None = None  # pods at once per Job (default: all)
    cpu: str | None = None  # per pod (default: one core per rank)
    memory: str | None = None  # per pod (default: 4Gi per rank plus /dev/shm)
    shm_gi: int = 1  # /dev/shm of each pod, in GiB (memory-backed: counts toward memory)
    scratch_gi: int = 10  # /tmp and /cache of each pod, in GiB each (node disk)
    ttl_s: int = 7 * 86400  # the finished Job and its pods are deleted after this


def _dns_name(text: str) -> str:
    """A DNS-1123 label: lower case, digits and '-', at most 63 characters."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return name[:63].rstrip("-") or "reprobox"


def is_digest_reference(image: str) -> bool:
    """`name@sha256:<64 hex>`: the bytes are fixed, whatever happens to tags."""
    return bool(DIGEST_REF.match(image))


def manifest(
    cells: list[JobCell],
    images: Mapping[int, str] | None = None,
    options: K8sOptions = K8sOptions(),
    environments: Mapping[int, Environment] | None = None,
) -> list[dict[str, Any]]:
    """ConfigMap + Indexed Job objects, one pair per distinct image, covering every cell
    once, then the pods' NetworkPolicy. `images` maps each cell's index to its image by
    digest; `options.image` instead names one image for all (the caller's explicit choice,
    digest or not), refused where `environments` (`cell_environments`) says the cells need
    more than one environment, unless `options.image_for_all`."""
    if not cells:
        raise BadInput("no cells to run")
    _check_options(options)
    if options.image and not options.image_for_all and environments is not None:
        check_one_image(options.image, cells, environments)
    groups: dict[str, list[JobCell]] = {}
    for cell in cells:
        image = options.image or (images or {}).get(cell.index)
        if image is None:
            raise BadInput(f"no image for cell {cell.label} of {cell.repro}")
        if options.image is None and not is_digest_reference(image):
            raise BadInput(f"image {image} of {cell.label} is not named by a sha256 digest")
        groups.setdefault(image, []).append(cell)
    base = _dns_name(f"reprobox-{cells[0].repro}")
    objects: list[dict[str, Any]] = []
    for number, (image, members) in enumerate(groups.items()):
        name = _dns_name(f"{base[:56]}-{number}") if len(groups) > 1 else base
        objects += _job_objects(name, image, members, options)
    return [*objects, network_policy(cells[0].repro, options)]


Environment = tuple[str, ...]  # the requirements a cell's lock (and so its image) is made from


def cell_environments(repro: spec.Repro, cells: list[JobCell]) -> dict[int, Environment]:
    """Each cell's environment: the requirements its lock is resolved from (the repro's,
    its platform's, its variant's pins and its matrix packages). Cells with different ones
    need different images; the rest of an image (Dockerfile, repro files) is the repro's."""
    return {
        c.index: tuple(sorted(repro.requirements(c.variant, c.platform, dict(c.packages))))
        for c in cells
    }


def check_one_image(
    image: str, cells: list[JobCell], environments: Mapping[int, Environment]
) -> None:
    """One image for all cells only when they share one environment: an image without a
    cell's packages runs that cell on the image's packages, and its verdict is then about
    them, not about the cell (a wrong verdict, not an error). Refused in one line."""
    groups: dict[Environment, list[JobCell]] = {}
    for cell in cells:
        groups.setdefault(environments[cell.index], []).append(cell)
    if len(groups) < 2:
        return
    (first, *_), (other, *_) = sorted(groups.values(), key=len, reverse=True)[:2]
    differ = sorted(set(environments[other.index]) - set(environments[first.index]))
    example = f"{other.label} installs {', '.join(differ) or 'other pins'}, {first.label} does not"
    raise BadInput(
        f"--image {image} would run {len(cells)} cells that need {len(groups)} different "
        f"environments ({example}), each cell measuring the image's packages; drop --image "
        "(each cell runs its own pushed image), select cells of one environment, or pass "
        "--image-for-all to run them all on it anyway"
    )


def _check_options(options: K8sOptions) -> None:
    check_count("--shm", options.shm_gi)
    check_count("--scratch", options.scratch_gi)
    check_count("--ttl", options.ttl_s, least=0)
    if options.parallelism is not None:
        check_count("--parallelism", options.parallelism)
    quantities = (
        ("--cpu", options.cpu, r"[0-9]+(\.[0-9]+)?|[0-9]+m"),
        ("--memory", options.memory, r"[0-9]+(Ki|Mi|Gi|Ti|k|M|G|T)?"),
    )
    for what, value, pattern in quantities:
        if value is not None and not re.fullmatch(pattern, value):
            raise BadInput(f"{what} {value!r}: not a Kubernetes quantity (e.g. 4, 500m, 16Gi)")


def _labels(repro: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "reprobox", "reprobox/repro": _dns_name(repro)}


def _meta(name: str, repro: str, options: K8sOptions) -> dict[str, Any]:
    """Name, labels and namespace. Without --namespace the objects go where the kubectl
    context points (a choice reprobox cannot make for the cluster), and say so to policy
    checkers (checkov's "no default namespace") in the manifest itself."""
    meta: dict[str, Any] = {"name": name, "labels": _labels(repro)}
    if options.namespace:
        meta["namespace"] = options.namespace
    else:
        meta["annotations"] = {"checkov.io/skip1": f"CKV_K8S_21={NO_NAMESPACE}"}
    return meta


def network_policy(repro: str, options: K8sOptions = K8sOptions()) -> dict[str, Any]:
    """No ingress to the repro's pods (cells and collector): nothing listens for anyone;
    the ranks of a cell meet inside their own pod, which a policy never blocks, and
    `kubectl cp` goes through the API server. Egress stays open (a pod's image pull is the
    node's, but a cell may read a package index or hub its repro names)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(_dns_name(f"reprobox-{repro}"[:52] + "-no-ingress"), repro, options),
        "spec": {"podSelector": {"matchLabels": _labels(repro)}, "policyTypes": ["Ingress"]},
    }


def _pod_security() -> dict[str, Any]:
    """The pod's side of the restricted level: the image's own non-root user and group."""
    return {
        "runAsNonRoot": True,
        "runAsUser": IMAGE_UID,
        "runAsGroup": IMAGE_UID,
        "fsGroup": IMAGE_UID,  # the claim's files are the image user's group
        "fsGroupChangePolicy": "OnRootMismatch",  # no recursive chown of a full claim
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _container_security() -> dict[str, Any]:
    """The container's side: nothing gained, nothing kept, nothing written but volumes."""
    return {
        "runAsNonRoot": True,
        "runAsUser": IMAGE_UID,
        "runAsGroup": IMAGE_UID,
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _resources(cells: list[JobCell], options: K8sOptions) -> dict[str, Any]:
    """Requests equal to limits (the Guaranteed class: a cell is not evicted or throttled
    below what its ranks need): one core and 4 GiB per rank, plus /dev/shm; GPUs one each."""
    processes = max(c.processes for c in cells)
    bounds: dict[str, Any] = {
        "cpu": options.cpu or str(processes),
        "memory": options.memory or f"{MEMORY_PER_PROCESS_GI * processes + options.shm_gi}Gi",
    }
    limits = dict(bounds)
    if cells[0].platform == "gpu":
        limits["nvidia.com/gpu"] = processes
    return {"requests": bounds, "limits": limits}


def _scratch_volumes(options: K8sOptions) -> list[dict[str, Any]]:
    return [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{options.shm_gi}Gi"}},
        {"name": "tmp", "emptyDir": {"sizeLimit": f"{options.scratch_gi}Gi"}},
        {"name": "cache", "emptyDir": {"sizeLimit": f"{options.scratch_gi}Gi"}},
    ]


def _scratch_mounts() -> list[dict[str, Any]]:
    return [
        {"name": "dshm", "mountPath": "/dev/shm"},  # NCCL and dataloaders need room here
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "cache", "mountPath": str(CACHE)},
    ]


def _job_objects(
    name: str, image: str, cells: list[JobCell], options: K8sOptions
) -> list[dict[str, Any]]:
    meta = _meta(name, cells[0].repro, options)
    data = json.dumps([c.to_json() for c in cells], indent=2)
    if len(data.encode()) > CONFIG_MAP_LIMIT:
        raise BadInput(f"{len(cells)} cells exceed a ConfigMap's 1 MiB; select fewer (--cells)")
    config_map: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {**meta, "name": f"{name}-cells"[:253]},
        "data": {CELLS_KEY: data},
    }
    container: dict[str, Any] = {
        "name": "cell",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python3", "-c", POD_SCRIPT],
        "env": [
            {
                # Set explicitly (the Job controller adds it too) so it is documented here.
                "name": "JOB_COMPLETION_INDEX",
                "valueFrom": {"fieldRef": {"fieldPath": INDEX_FIELD}},
            },
            {"name": CACHE_ENV, "value": str(CACHE)},
        ],
        "securityContext": _container_security(),
        "resources": _resources(cells, options),
        "volumeMounts": [
            {"name": "cells", "mountPath": CELLS_MOUNT, "readOnly": True},
            {"name": "out", "mountPath": OUT_MOUNT},
            *_scratch_mounts(),
        ],
    }
    count = len(cells)
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "completionMode": "Indexed",
            "completions": count,
            "parallelism": min(options.parallelism or count, count),
            # A failed cell is retried once and never fails its neighbours (k8s >= 1.29).
            "backoffLimitPerIndex": 1,
            "maxFailedIndexes": count,
            "ttlSecondsAfterFinished": options.ttl_s,
            "template": {
                "metadata": {"labels": meta["labels"]},
                "spec": {
                    "restartPolicy": "Never",
                    "activeDeadlineSeconds": int(max(c.timeout for c in cells)) + DEADLINE_MARGIN_S,
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": _pod_security(),
                    "containers": [container],
                    "volumes": [
                        {"name": "cells", "configMap": {"name": config_map["metadata"]["name"]}},
                        {"name": "out", "persistentVolumeClaim": {"claimName": options.claim}},
                        *_scratch_volumes(options),
                    ],
                },
            },
        },
    }
    return [config_map, job]


def collector(repro: str, image: str, options: K8sOptions = K8sOptions()) -> dict[str, Any]:
    """A pod that mounts the claim read-only and waits, so that `kubectl cp` (which runs
    `tar` in a running container; a finished pod has none) can copy `/out/<repro>` home.
    Confined like the cells' pods; it stops by itself after COLLECTOR_S."""
    _check_options(options)
    name = _dns_name(f"reprobox-{repro}"[:54] + "-collect")
    container = {
        "name": "collect",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sleep", str(COLLECTOR_S)],
        # ready (and alive) while the claim is mounted: then `kubectl cp` finds /out
        "readinessProbe": {"exec": {"command": ["test", "-d", OUT_MOUNT]}, "periodSeconds": 5},
        "livenessProbe": {"exec": {"command": ["test", "-d", OUT_MOUNT]}, "periodSeconds": 60},
        "securityContext": _container_security(),
        "resources": {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"cpu": "1", "memory": "512Mi"},
        },
        "volumeMounts": [
            {"name": "out", "mountPath": OUT_MOUNT, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _meta(name, repro, options),
        "spec": {
            "restartPolicy": "Never",
            "activeDeadlineSeconds": COLLECTOR_S + 60,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "securityContext": _pod_security(),
            "containers": [container],
            "volumes": [
                {
                    "name": "out",
                    "persistentVolumeClaim": {"claimName": options.claim, "readOnly": True},
                },
                {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
            ],
        },
    }


class _Dumper(yaml.SafeDumper):
    """Plain YAML for people: no anchors, multi-line strings (script, cells) as blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)

HEADER = f"""\
# Generated by `reprobox k8s`. Needs Kubernetes {MIN_KUBERNETES} or newer (backoffLimitPerIndex,
# maxFailedIndexes), a ReadWriteMany claim for /out, and images pushed by digest
# (`nox -s image -- REPRO --variant V --push REGISTRY`). Pods meet Pod Security "restricted".
"""


def dump(objects: list[dict[str, Any]]) -> str:
    """Multi-document YAML that `kubectl apply -f` takes."""
    return HEADER + yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, width=100)
