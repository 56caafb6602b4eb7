"""pytest setup for this member's tests, also when pytest runs from this directory: tests
marked `gpu` run only on an sm_90 (Hopper) CUDA GPU and are skipped elsewhere."""
from moe_common.testing import skip_gpu_test_without_hopper as pytest_runtest_setup  # noqa: F401
