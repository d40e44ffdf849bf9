"""Figures from stored results, torch-free: speedups and savings (speedups), the headline sentences,
compare, the fidelity and headroom verdicts, and gate/ (change points, history, annotations,
nightly). Reads the store; never imports measure, launchers or studies."""
