"""Studies: every study a plan file (nlq/plans/*.toml), in four parts, each importing only from those before it
(tests/test_architecture.py): inference (statistics), definition (what a study is, as data), running (the engine and the
runner), reports; registry.py names the shipped plans and their report flows, launch.py starts a study's shards."""
