"""sm_90 (H100 / H200) limits the kernels size themselves by (CUDA C Programming Guide,
"Technical Specifications per Compute Capability", 9.0)."""

SMEM_PER_CTA = 227 * 1024  # the largest dynamic shared memory of one CTA
