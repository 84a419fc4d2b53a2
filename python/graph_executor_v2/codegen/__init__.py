"""Generated kernels: CUDA C++ written from a group of pointwise ops (and a row reduction with its pointwise
prologue and epilogue), compiled with NVRTC when a plan is built, cached on disk, launched like every op.

- ``group.py``: a fused group as data (the ``members`` attribute of the fused ops in ``ops/fused.py``);
- ``pointwise.py`` and ``reduction.py``: the source of a group, specialized to its concrete shapes;
- ``elements.py``: how each dtype is stored, computed in, loaded and stored;
- ``compiler.py``: NVRTC through the native ``_codegen`` module (src/codegen/codegen_pybind.cpp), the cubin cache,
  GE2_DUMP_KERNELS, compile statistics;
- ``candidate.py``: the ``generated`` kernel candidate and the parallel precompilation of a plan's fused kernels.

The fusion pass that makes the groups is ``passes/pointwise_fusion.py``.
"""
