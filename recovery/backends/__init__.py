"""Backends carry a plan's actions out: locally on torchrun, on Slurm, on Kubernetes.

Each is dry-run unless ``apply=True``: a dry run returns the exact commands or API calls it would make.
"""

from __future__ import annotations

from .base import Backend, StepResult

BACKENDS = ("local", "slurm", "k8s")

__all__ = ["BACKENDS", "Backend", "StepResult"]
