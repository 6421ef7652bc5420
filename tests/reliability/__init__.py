"""Reliability tests, one file per entry point: what a student types (train, train --hf, train-hf-model, bench,
generate), what a notebook or widget is given (parameters), and the files the lab reads (checkpoints, model folders,
records). `test_every_command` holds what the CLI checks once for all of them.

Each file is a few tables, one per mechanism (the out folder, the save set, resume, bounded reads, sizes before
allocation, a full disk, ...): a row is an input of the reliability probes (../shared/reviews/2026-12-01-reliability*.md)
and the one line it must end in. Where an input used to allocate without bound, the row runs in a child process
under RLIMIT_AS.
"""
