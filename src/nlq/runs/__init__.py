"""What a run directory holds on disk: checkpoints, model.safetensors, metrics.jsonl, summary.json, config.json,
the data's meta and tokenizer; the readers and writers of each."""
