"""Backends carry a plan's actions out: locally on torchrun, on Slurm, on Kubernetes.

Each is dry-run unless ``apply=True``: a dry run returns the exact commands or API calls it would make.
"""

from __future__ import annotations

from typing import Any

from rankscope.spine import InputError

from .base import Backend, StepResult

BACKENDS = ("local", "slurm", "k8s")

__all__ = ["BACKENDS", "Backend", "StepResult", "make_backend"]


def make_backend(name: str, **options: Any) -> Backend:
    """A backend by name: ``slurm`` (job_id, mode), ``k8s`` (namespace, pod_selector, job_name) or ``local``
    (command, machines, standby, ckpt_root, run_dir, nproc_per_machine; or only run_dir: the job it launched)."""
    if name == "slurm":
        from .slurm import SlurmBackend

        return SlurmBackend(**options)
    if name == "k8s":
        from .k8s import K8sBackend

        return K8sBackend(**options)
    if name == "local":
        from .local import LocalBackend

        if set(options) == {"run_dir"}:  # a job the local backend launched: its state file says the rest
            return LocalBackend.load(options["run_dir"])
        return LocalBackend(**options)
    raise InputError(f"--backend {name!r} is not one of {', '.join(BACKENDS)}")
