"""moe-gated's plugin: bids above moe-generic on large routed batches.

The hook is moe_common.kernel_package's, bound to this package's limits, priority and runner:
it depends on moe_common alone, so the package works installed alone; the dispatcher finds it
through the "fused_moe.kernels" entry point.
"""
from __future__ import annotations

from moe_common.kernel_package import can_handle_hook

from .limits import KERNEL_NAME, priority, unsupported_reason

can_handle = can_handle_hook(KERNEL_NAME, unsupported_reason, priority, "moe_gated.runner")
