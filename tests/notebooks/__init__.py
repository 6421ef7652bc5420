"""Tests of the notebooks: their runs, their prose against the lab, notebook 05's settings, the report and the browser."""
