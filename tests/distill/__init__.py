"""Tests of mtplab.distill: the chat data and its shards, the work folders' files and options, the GPU sitting
(scripts/distill_gpu.py). The stages on a tiny Llama share its fixtures in tests/hf/test_real.py."""
