"""Tests of mtplab.bench: the bench entry points, the real-model bench, preflight, peers."""
