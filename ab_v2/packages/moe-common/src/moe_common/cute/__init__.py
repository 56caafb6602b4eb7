"""CuTe DSL building blocks shared by the kernels (imported lazily: needs nvidia-cutlass-dsl)."""
