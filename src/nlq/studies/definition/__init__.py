"""What a study is, as data, and how its files read: a plan file (plan.py), its typed design (plan_design.py: a
decision's Design; plan_explore.py: an exploratory kind's), the study, its arms and runs, plan hashes and the checked
reading of study.json (design.py), and a study directory's finished runs as tables (tables.py). No trainer, no torch."""
