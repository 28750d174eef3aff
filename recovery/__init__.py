"""The recovery executor: from a verdict, events and logs to one plan, and from a plan to actions.

- :mod:`.catalog` and :mod:`.classify` sort exit codes and log lines into fault categories (a table
  users can extend);
- :mod:`.ladder` is ByteRobust's decision ladder, pure: a :class:`~.situation.Situation` in, a
  :class:`~.plan.Plan` out; its rules are in :mod:`.rules`, what they read in :mod:`.evidence`;
- :mod:`.guardrails` (caps, cool-down, idempotency, membership, standby, quarantine), :mod:`.procs` (one
  executor per job, argv-only subprocesses) and :mod:`.audit` (the append-only audit trail);
- :mod:`.sources` reads a plan's inputs (a verdict file, a store, a dump directory) and
  :mod:`.executor` carries a plan out through :mod:`.backends` (local torchrun, Slurm, Kubernetes;
  dry run by default);
- :mod:`.standby` sizes the warm-standby pool (binomial P99, as in ByteRobust).
"""
