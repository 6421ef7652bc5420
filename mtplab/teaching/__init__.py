"""ONE COMPANION MODULE PER NOTEBOOK: the lessons' studies and the exercises' checkers.

* `check`: `Check`, a checker's verdict; a checker never raises on a student's code
* `bottleneck` (01): timed decodes with and without a cache, INT8, ms per token; two checkers
* `blockwise` (02): forwards with a perfect drafter, one verify forward laid out, cache lengths; three checkers
* `meta` (03): the head-by-head backward's memory and gradients, the packed loss's shift, the families side by side
* `deepseek` (04): eq. 24 checked against the model, teacher forcing against free running; two checkers
* `acceptance_lab` (05): the widget: pure state, a session (models, decode, race), an ipywidgets view, exercises
* `sampling` (06): exact counts of what the accept rule emits, chi-square against the target; two checkers
* `batches` (07): the batch sweep's and the tree's verdicts in words read from the rows; two checkers
* `find_the_bug` (08): eight accept rules, some with a planted bug, the test that finds them, the key kept hidden until earned
* `engines` (09): acceptance with n, intervals and loops; typical acceptance against the exact rule; two records reconciled
* `classroom` (01): the class as data: a folder of preflight records, speedup against cores, cache and threads
* `real` (01, 05, 09): SmolLM2 in the notebooks: its cost curve, its projection's cost, live races, a chat answer token by token
* `peers` (10): your own Hugging Face model, the peer table's pairs on the same drafts, code against prose; a checker

Imported only by notebooks and tests. May import every layer below but `distill` (`hf` lazily, for the widget's own-model
folders); `bench` never imports it.
"""
