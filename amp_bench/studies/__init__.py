"""What a user runs: the opening every study shares (session), the benchmark run (benchmark), the
batch-size headroom search (headroom), the accuracy-parity study (fidelity/) and the pytest plugin.
Each drives workers and writes a run directory through the store."""
