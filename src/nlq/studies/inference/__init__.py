"""The statistics every study reads with: paired t intervals, Holm, equivalence tests, power (stats.py), the lr
selection rules (selection.py) and group-sequential bounds (sequential.py). Pure numbers: no study, no file."""
