"""Tests of mtplab.viz: the figures."""
