"""Tests of mtplab.training: training runs, losses, resume and faults, DDP."""
