"""What happens inside a worker process: the case (prepare_case, build_step, run_case), the
training step, precision modes' torch side, fp8, torch.compile, models (built only here), the
measured window and its timers, DDP's rank side, the event channel back to the parent, GradScaler
health, and telemetry (contention, per-phase memory, FLOPs). Imports platform, suite and stats."""
