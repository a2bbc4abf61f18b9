"""Operating on runs across parts: cancelling a run (its approvals and pending effects with it)
and reading its timeline (run events, steps, approvals, effects). Above runs, approvals and
effects, so none of those needs to know about the others' tables."""
