"""Where a study's cases run when not on this machine: SLURM jobs, submitted through submitit.

  slurm.py       submission (submitit's AutoExecutor: sbatch arrays on a cluster, or its local executor),
                 cancelling, what a partition's nodes have (sinfo)
  job_states.py  SLURM's word on a job: squeue (queued, running, recently ended), then sacct, then
                 scontrol; parsed from their text
  job_env.py     inside a job: which job, array task, partition and node this is, and the signals that
                 end it (scancel, the time limit, preemption) as one stop request with SLURM's reason

The study (studies/cluster.py) decides what each job runs; this layer only places jobs and reads their
state. submitit is imported when a job is submitted, so the rest of amp_bench never needs it.
"""
