"""moe-generic's plugin: offers the kernel for every shape it supports on sm_90 devices.

The hook is moe_common.kernel_package's, bound to this package's limits, priority and runner:
it depends on moe_common alone, so the package works installed alone; the dispatcher finds it
through the "fused_moe.kernels" entry point.
"""
from __future__ import annotations

from moe_common.kernel_package import can_handle_hook
from moe_common.types import PRIORITY_GENERIC

from .limits import KERNEL_NAME, unsupported_reason

can_handle = can_handle_hook(KERNEL_NAME, unsupported_reason, lambda shape: PRIORITY_GENERIC,
                             "moe_generic.runner")
