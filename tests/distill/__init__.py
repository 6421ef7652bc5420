"""Tests of mtplab.distill: the chat data, the work folders and their files, the stages (one GPU process too)."""
