"""Run a repro's cells as a Kubernetes Indexed Job, and import what the pods wrote.

One pod per cell: the Job runs with `completionMode: Indexed`, a ConfigMap holds the cells as
JSON, and each pod picks its cell by `JOB_COMPLETION_INDEX`, runs the repro's image with that
cell's launcher and arguments, and leaves `cell.json`, `result.json`, `launch.log` and
`exit_code` in `/out/<index>/` on a shared volume. A pod template has one image, so cells that
need different environments (variant, package versions) go to one Job each; the index in
`/out/<index>/` is the cell's place in the whole list, so the directories never collide.

`reprobox collect` (scaleout/collect.py) turns such a tree into records under results/.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import yaml

from reprobox.core.errors import BadInput
from reprobox.run.layout import IMAGE_UID, OUT
from reprobox.scaleout.jobs import JobCell

CELLS_KEY = "cells.json"
CELLS_MOUNT = "/etc/reprobox"
OUT_MOUNT = str(OUT)
CELL_FILE = "cell.json"
EXIT_FILE = "exit_code"
VERDICT_EXIT_CODES = (0, 1, 125)
DEADLINE_MARGIN_S = 300  # image pull and start-up on top of [launch] timeout
INDEX_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"

# What each pod runs, with the image's own Python: pick the cell, run it, keep its output.
# A verdict (0 clean, 1 reproduced, 125 cannot test) is a successful pod; anything else fails
# it, so Kubernetes retries that index and the Job's status shows the error.
POD_SCRIPT = f"""\
import json, os, subprocess, sys
index = int(os.environ["JOB_COMPLETION_INDEX"])
with open("{CELLS_MOUNT}/{CELLS_KEY}") as f:
    cell = json.load(f)[index]
out = os.path.join("{OUT_MOUNT}", str(cell["index"]))
os.makedirs(out, exist_ok=True)
for stale in ("result.json", "{EXIT_FILE}"):
    if os.path.exists(os.path.join(out, stale)):
        os.remove(os.path.join(out, stale))
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
    image_prefix: str = "reprobox"  # images are <prefix>/<repro>:<cell image tag>
    image: str | None = None  # one image holding every cell's environment: one Job in all
    claim: str = "reprobox-results"  # a ReadWriteMany PersistentVolumeClaim mounted at /out
    namespace: str | None = None
    parallelism: int | None = None  # pods at once per Job (default: all)


def _dns_name(text: str) -> str:
    """A DNS-1123 label: lower case, digits and '-', at most 63 characters."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return name[:63].rstrip("-") or "reprobox"


def manifest(cells: list[JobCell], options: K8sOptions = K8sOptions()) -> list[dict[str, Any]]:
    """ConfigMap + Indexed Job objects, one pair per distinct image, covering every cell once."""
    if not cells:
        raise BadInput("no cells to run")
    groups: dict[str, list[JobCell]] = {}
    for cell in cells:
        groups.setdefault(options.image or cell.image_tag, []).append(cell)
    base = _dns_name(f"reprobox-{cells[0].repro}")
    objects: list[dict[str, Any]] = []
    for number, (tag, members) in enumerate(groups.items()):
        name = _dns_name(f"{base[:56]}-{number}") if len(groups) > 1 else base
        image = options.image or f"{options.image_prefix.rstrip('/')}/{members[0].repro}:{tag}"
        objects += _job_objects(name, image, members, options)
    return objects


def _job_objects(
    name: str, image: str, cells: list[JobCell], options: K8sOptions
) -> list[dict[str, Any]]:
    labels = {"app.kubernetes.io/name": "reprobox", "reprobox/repro": _dns_name(cells[0].repro)}
    meta: dict[str, Any] = {"name": name, "labels": labels}
    if options.namespace:
        meta["namespace"] = options.namespace
    config_map: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {**meta, "name": f"{name}-cells"[:253]},
        "data": {CELLS_KEY: json.dumps([c.to_json() for c in cells], indent=2)},
    }
    container: dict[str, Any] = {
        "name": "cell",
        "image": image,
        "command": ["python3", "-c", POD_SCRIPT],
        "env": [
            {
                # Set explicitly (the Job controller adds it too) so it is documented here.
                "name": "JOB_COMPLETION_INDEX",
                "valueFrom": {"fieldRef": {"fieldPath": INDEX_FIELD}},
            }
        ],
        "volumeMounts": [
            {"name": "cells", "mountPath": CELLS_MOUNT, "readOnly": True},
            {"name": "out", "mountPath": OUT_MOUNT},
            {"name": "dshm", "mountPath": "/dev/shm"},  # NCCL and dataloaders need room here
        ],
    }
    if cells[0].platform == "gpu":
        gpus = max(c.processes for c in cells)
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    count = len(cells)
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "completionMode": "Indexed",
            "completions": count,
            "parallelism": min(options.parallelism or count, count),
            # A failed cell is retried once and never fails its neighbours (k8s >= 1.33).
            "backoffLimitPerIndex": 1,
            "maxFailedIndexes": count,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "activeDeadlineSeconds": int(max(c.timeout for c in cells)) + DEADLINE_MARGIN_S,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": IMAGE_UID,
                        "runAsGroup": IMAGE_UID,
                        "fsGroup": IMAGE_UID,
                    },
                    "containers": [container],
                    "volumes": [
                        {"name": "cells", "configMap": {"name": config_map["metadata"]["name"]}},
                        {"name": "out", "persistentVolumeClaim": {"claimName": options.claim}},
                        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
                    ],
                },
            },
        },
    }
    return [config_map, job]


class _Dumper(yaml.SafeDumper):
    """Plain YAML for people: no anchors, multi-line strings (script, cells) as blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(objects: list[dict[str, Any]]) -> str:
    """Multi-document YAML that `kubectl apply -f` takes."""
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, width=100)
