"""What another GPU would give: a run's profiled steps scaled to GPUs it did not run on, torch-free.

ops.py costs an aten op from its recorded shapes; inventory.py reads a trace into pieces of work;
scaling.py holds the rules; source.py picks each case's source rows; model.py predicts a run on targets
with intervals; settings.py reads the suite's `predict:` block and writes the notes; neusight.py scores
the rules on NeuSight's public per-op labels. The GPU spec table is amp_bench/platform/gpu_specs.py.
"""
