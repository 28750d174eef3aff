"""The recovery executor: from a verdict, events and logs to one plan, and from a plan to actions.

- :mod:`.classify` sorts exit codes and log lines into fault categories (a table users can extend);
- :mod:`.ladder` is ByteRobust's decision ladder, pure: inputs in, a :class:`~.plan.Plan` out;
- :mod:`.guardrails` caps, cool-down, idempotency, the per-job lock, the audit trail;
- :mod:`.backends` carry a plan out on a local torchrun job, Slurm or Kubernetes (dry run by default);
- :mod:`.standby` sizes the warm-standby pool (binomial P99, as in ByteRobust).
"""
