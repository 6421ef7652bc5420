"""Notebook 05's acceptance lab: step through a speculative decode and watch which drafts the target keeps.

* `state`: `LabState` and the pure functions that reveal a decoded trace, tested without a browser
* `session`: what touches the world: the model cache, the default demo read from the shipped benchmark, and
  `decode` (the decode with what each step's accept rule saw, raced against AR); it imports `state`, never the
  other way round
* `view`: HTML views of a state and `AcceptanceLab`, the ipywidgets front (imported lazily)
* `exercises`: notebook 05's checkers
"""
