"""Explaining a speedup: where each step's time goes under every precision mode (issue 23); torch-free.
The profiled step itself is taken in the worker (measure/telemetry/profile.py), which saves its trace
and the GEMM/conv layers' shapes; everything here reads and judges what it saved.

- categories.py: the categories and the kernel / CPU-op classifiers
- trace.py: one profiled step read from its Chrome trace: time per category, phase, busy and host
- alignment.py: Tensor Core alignment of every GEMM / conv layer, with its FLOP share
- decompose.py: the speedup decomposed against fp32, the Amdahl ceiling, the sentence, the results columns
- judge.py: a results row's explain_* columns from the trace and layers its worker saved (`explain_row`)
"""
