"""client/api/patches.py: the changes to PyTorch's own objects are in place after `import torch`,
and each is made once, whoever calls it again."""

from __future__ import annotations

import torch
import torch.distributed as dist
from trnsim.client.api import patches

AT_IMPORT = {
    "module_apply_keeps_ties",
    "accelerator_calls_reach_neuron",
    "tensor_pinning_for_neuron",
    "torch_profiler_sees_the_device",
    "autocast_defaults_to_bfloat16",
    "ddp_refuses_used_parameter_map",
}


def _patched() -> list[object]:
    from torch.autograd import profiler as autograd_profiler

    return [
        torch.nn.Module._apply,
        torch.accelerator.synchronize,
        torch.Tensor.pin_memory,
        torch.Tensor.is_pinned,
        autograd_profiler.profile.__exit__,
        torch.amp.autocast_mode.autocast.__init__,
        torch.nn.parallel.DistributedDataParallel.__init__,
    ]


def test_the_import_time_patches_are_in_place() -> None:
    assert AT_IMPORT <= patches.installed()


def test_a_patch_called_again_changes_nothing() -> None:
    before = _patched()
    patches.module_apply_keeps_ties()
    patches.accelerator_calls_reach_neuron()
    patches.tensor_pinning_for_neuron()
    patches.torch_profiler_sees_the_device()
    patches.autocast_defaults_to_bfloat16()
    patches.ddp_refuses_used_parameter_map()
    assert all(a is b for a, b in zip(before, _patched(), strict=True))


def test_fsdp_storage_is_patched_once_by_the_first_neuron_group() -> None:
    from torch.distributed.fsdp._fully_shard import _fsdp_param

    dist.init_process_group("neuron", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert "fsdp_parks_storage" in patches.installed()
        free = _fsdp_param.free_storage
        patches.fsdp_parks_storage()
        assert _fsdp_param.free_storage is free
    finally:
        dist.destroy_process_group()
