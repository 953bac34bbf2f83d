"""slurmgpu: GPU node health gating and fleet health for Slurm clusters."""

__version__ = "0.1.0"
