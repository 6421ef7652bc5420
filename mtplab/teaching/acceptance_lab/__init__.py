"""Notebook 05's acceptance lab: step through a speculative decode and watch which drafts the target keeps.

* `state`: `LabState` and the pure functions that advance it, tested without a browser
* `view`: HTML views of a state and `AcceptanceLab`, the ipywidgets front (imported lazily)
* `exercises`: notebook 05's checkers
"""
