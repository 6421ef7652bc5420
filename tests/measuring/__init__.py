"""Tests of mtplab.measuring: acceptance metrics, teacher-forced and domain studies, races, timers, records, regimes,
the speedup split."""
