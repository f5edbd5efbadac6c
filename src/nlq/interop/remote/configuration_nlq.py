"""Hugging Face config of an exported nlq model (shipped into the export directory; trust_remote_code)."""

from transformers import PretrainedConfig


class NlqConfig(PretrainedConfig):
    model_type = "nlq"

    def __init__(self, nlq_model: dict | None = None, **kwargs):
        self.nlq_model = dict(nlq_model or {})  # nlq's ModelConfig as a dict: the whole architecture
        m = self.nlq_model
        kwargs.setdefault("tie_word_embeddings", m.get("tie_embeddings", True))
        self.vocab_size = m.get("vocab_size")
        self.max_position_embeddings = m.get("block_size")  # lm-evaluation-harness reads the context from here
        self.hidden_size = m.get("n_embd")
        self.num_hidden_layers = m.get("n_layer")
        self.num_attention_heads = m.get("n_head")
        super().__init__(**kwargs)
