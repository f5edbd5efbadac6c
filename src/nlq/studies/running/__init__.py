"""What runs a study: a decision plan's stages (engine.py: the lr rule, the sequential test; borrow.py), an exploratory
plan's (families.py), WSD chains (wsd.py), the runner itself (study.py: resume, shards; sharding.py, frozen.py), the dry
run and its costs (dry_run.py, plan_costs.py) and copying finished runs (collect.py)."""
