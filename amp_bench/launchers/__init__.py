"""Where a case runs: the parent's worker manager (process: a killable worker with a deadline, its log
and rusage), one case -> one worker -> one row (launch), and torchrun's launcher side (torchrun)."""
