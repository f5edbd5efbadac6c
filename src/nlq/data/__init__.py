"""Data: sources -> tokenizers -> token shards (nlq prepare) -> deterministic batch plans."""
