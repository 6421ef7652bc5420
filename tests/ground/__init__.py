"""Tests of the ground floor (the top-level modules: errors, files, paths, device, data, tokenizer, platform_compat,
cli) and of the package as a whole: install, environment, portability, layout."""
