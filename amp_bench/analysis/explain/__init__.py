"""Explaining a speedup: where each step's time goes under every precision mode; torch-free.
The profiled steps are taken in the worker (measure/telemetry/profile.py), which saves their trace,
the GEMM/conv layers' shapes and on a CPU the oneDNN kernels; everything here reads and judges them.

- categories.py: the categories, HTA's kernel kinds and the kernel / CPU-op classifiers
- events.py: what every trace reader shares (loading, CPU event trees, steps, Profile)
- trace.py: the CPU steps of a trace, and `read_profile` for any trace; gpu_trace.py: the GPU side
  (HTA's selection and counting, overlapping streams split, idle, Tensor Cores)
- kernels.py: Tensor Core use by kernel family; onednn.py: the CPU's analogue (oneDNN's kernels)
- alignment.py: Tensor Core alignment of every GEMM / conv layer, with its FLOP share
- ceiling.py: each category's ideal speedup per mode and hardware, the ceiling, what holds the rest back
- noise.py: spreads over profiled steps, the "changed" rule, profile-vs-measurement agreement
- decompose.py: the speedup decomposed against fp32, the results columns; sentence.py: the sentence
- judge.py: a results row's explain_* columns from what its worker saved (`explain_row`)
- any_trace.py: `explain --trace A [--trace B]` on any torch.profiler / Kineto trace; trace_pair.py: what
  differs between two such traces (device, model, precision) and their ceiling, each side on its own GPU
"""
