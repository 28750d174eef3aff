"""Process roles (standard library only, so readers can check them without importing the store's pyarrow)."""

ROLES = ("trainer", "dataloader", "checkpoint", "other")
"""Process roles: a torchrun worker, a DataLoader worker, a checkpoint writer, anything else."""
