"""Tests of mtplab.teaching: the words the notebooks show, the exercises, find the bug, the classroom, the acceptance lab."""
