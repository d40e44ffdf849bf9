"""What is read beside the timed steps, never inside them: contention at the window's edges,
per-phase memory and FLOPs in one instrumented step after the window."""
