"""Tests of mtplab.model: the classroom GPT, its heads, the kernels and attention, the lab's exact Llama forward."""
