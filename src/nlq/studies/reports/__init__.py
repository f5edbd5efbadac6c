"""What a study's report says, by its flow (plan_report.FLOWS): a decision's (plan_report.py with plan_selection.py,
plan_sections.py, plan_robust.py, plan_plots.py) and an exploratory plan's (comparison.py, scaling.py, probes.py;
plots.py)."""
