"""Average a model's weights across ranks (or across copies) without being fooled by ties.

`model.state_dict()` lists a tied weight once per name: GPT-2's `transformer.wte.weight` and
`lm_head.weight` are two entries sharing one storage. A loop that all-reduces each entry with
SUM and then rebinds `sd[k] = sd[k] / world_size` sums the shared storage once per alias, so
the last alias ends at world_size**(k-1) x the mean (huggingface/transformers#32272). These
functions reduce each storage exactly once and keep the tie in what they return, so
`model.load_state_dict(result)` restores a correctly averaged, still-tied model.

Use it on any transformers / torch version:

    from tied_average import average_state_dict       # with fixes/ on PYTHONPATH
    model.load_state_dict(average_state_dict(model.state_dict()))

Integer buffers (e.g. position ids) are identical across ranks and are copied, not averaged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist


def alias_key(tensor: torch.Tensor) -> tuple:
    """Two entries alias exactly when they view the same bytes the same way."""
    return (
        tensor.untyped_storage().data_ptr(),
        tensor.storage_offset(),
        tuple(tensor.shape),
        tuple(tensor.stride()),
    )


def average_state_dict(
    state_dict: Mapping[str, torch.Tensor], group: dist.ProcessGroup | None = None
) -> dict[str, torch.Tensor]:
    """The mean over the ranks of `group` of every entry; aliases stay aliases."""
    world_size = dist.get_world_size(group)
    averaged: dict[tuple, torch.Tensor] = {}
    result = {}
    for name, tensor in state_dict.items():
        key = alias_key(tensor)
        if key not in averaged:
            copy = tensor.detach().clone()
            if copy.is_floating_point() or copy.is_complex():
                dist.all_reduce(copy, op=dist.ReduceOp.SUM, group=group)
                copy.div_(world_size)
            averaged[key] = copy
        result[name] = averaged[key]
    return result


def average_state_dicts(
    state_dicts: Sequence[Mapping[str, torch.Tensor]],
) -> dict[str, torch.Tensor]:
    """The mean of several local state dicts (federated averaging, SWA-style loops)."""
    if not state_dicts:
        raise ValueError("average_state_dicts needs at least one state dict")
    first = state_dicts[0]
    averaged: dict[tuple, torch.Tensor] = {}
    result = {}
    for name, tensor in first.items():
        key = alias_key(tensor)
        if key not in averaged:
            if tensor.is_floating_point() or tensor.is_complex():
                stacked = torch.stack([sd[name].detach() for sd in state_dicts])
                averaged[key] = stacked.mean(dim=0)
            else:
                averaged[key] = tensor.detach().clone()
        result[name] = averaged[key]
    return result
