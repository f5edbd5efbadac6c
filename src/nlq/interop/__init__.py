"""nlq outside nlq: retrofit Hugging Face models (hf.py), export runs as Hugging Face directories (export.py),
and start from weights trained elsewhere: HF GPT-2, the paper's checkpoints, other runs (load.py)."""
