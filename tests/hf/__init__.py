"""Tests of mtplab.hf: Hugging Face models, the real model (SmolLM2), the shipped checkpoints."""
