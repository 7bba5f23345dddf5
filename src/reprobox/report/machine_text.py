"""The machine under the runs (a record's `machine`, run/machine.py) as the comment's
environment section shows it: one table, a fact the cells share in one row, a fact that
differs between them in a row per value naming its cells. Trimmed to what says something:
a fact nobody recorded (no GPU, no NCCL pinned, no variable set) has no row, and the
variables are only those set for the launch."""

from __future__ import annotations

from collections.abc import Sequence

from reprobox.core.records import Record
from reprobox.report import markdown as md

# The order rows come in; `env NAME` rows follow, by name.
ORDER = (
    "kernel", "cpu", "cpu_flags", "dev_shm", "gpu", "driver", "cuda_runtime", "nccl", "image",
)  # fmt: skip
TITLES = {
    "kernel": "kernel", "cpu": "CPU", "cpu_flags": "CPU flags (numerics)",
    "dev_shm": "/dev/shm", "gpu": "GPUs", "driver": "NVIDIA driver",
    "cuda_runtime": "CUDA runtime (pinned)", "nccl": "NCCL (pinned)", "image": "image digest",
}  # fmt: skip


def machine_table(records: Sequence[Record]) -> str:
    """The table, or "" when no record holds a machine (records older than the field)."""
    with_facts = [r for r in records if r.machine]
    if not with_facts:
        return ""
    keys = {key for record in with_facts for key in record.machine}
    ordered = [k for k in ORDER if k in keys] + sorted(k for k in keys if k not in ORDER)
    rows = []
    for key in ordered:
        values: dict[str, list[str]] = {}
        for record in with_facts:
            values.setdefault(record.machine.get(key, "(not set)"), []).append(record.label)
        title = TITLES.get(key, key.removeprefix("env "))
        title = md.code(title) if key.startswith("env ") else md.text(title)
        if len(values) == 1:
            [value] = values
            rows.append([title, md.code(value), "all"])
            continue
        for value, labels in values.items():
            shown = ", ".join(md.code(x) for x in labels[:4])
            if len(labels) > 4:
                shown += f" and {len(labels) - 4} more"
            rows.append([title, md.code(value), shown])
    return "The machine under the runs:\n\n" + md.table(["", "value", "cells"], rows)
