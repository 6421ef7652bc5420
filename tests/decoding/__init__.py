"""Tests of mtplab.decoding: the loops, acceptance rules, sampling, trees, batches, engines, the stop token."""
