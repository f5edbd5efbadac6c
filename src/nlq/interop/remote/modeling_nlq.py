"""Hugging Face wrappers around nlq's own Transformer (nlq_model.py beside this file is nlq's model.py,
copied at export with its imports made relative), so an exported model computes exactly what nlq does.
Shipped into the export directory; load with trust_remote_code=True."""

import torch
import torch.nn.functional as F
import transformers
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput, MaskedLMOutput

from .configuration_nlq import NlqConfig
from .nlq_config import ModelConfig, ProjectionsConfig
from .nlq_model import Transformer, rotary_tables

_TIED = ({"model.lm_head.weight": "model.tok_emb.weight"} if int(transformers.__version__.split(".")[0]) >= 5
         else ["model.lm_head.weight"])


def _model_config(raw: dict) -> ModelConfig:
    raw = dict(raw)
    raw["projections"] = ProjectionsConfig(**(raw.get("projections") or {}))
    return ModelConfig(**raw)


class NlqPreTrainedModel(PreTrainedModel):
    config_class = NlqConfig
    base_model_prefix = "model"

    def __init__(self, config: NlqConfig):
        super().__init__(config)
        self.model = Transformer(_model_config(config.nlq_model))
        if config.nlq_model.get("tie_embeddings", True):
            self._tied_weights_keys = _TIED
        self.post_init()

    def _init_weights(self, module):
        """nlq's Transformer initialises its weights itself, and loading overwrites them. What loading does not
        hold are the rotary tables (buffers that are not saved): computed again here, where transformers
        materialises a model built on the meta device."""
        if isinstance(module, Transformer) and module.cfg.position == "rope":
            cfg = module.cfg
            cos, sin = rotary_tables(cfg.head_size, cfg.block_size, cfg.rope_theta, device=module.rope_cos.device)
            with torch.no_grad():
                module.rope_cos.copy_(cos)
                module.rope_sin.copy_(sin)

    def get_input_embeddings(self):
        return self.model.tok_emb

    def set_input_embeddings(self, value):
        self.model.tok_emb = value

    def get_output_embeddings(self):
        return self.model.lm_head


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) positions of the real tokens of left-padded rows, counted from each row's first real token (pads 0),
    as GPT-2 in transformers does: a row reads the same alone as inside a padded batch."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


class NlqForCausalLM(NlqPreTrainedModel, GenerationMixin):
    def forward(self, input_ids=None, attention_mask=None, labels=None, position_ids=None, **kwargs):
        padding = attention_mask.bool() if attention_mask is not None and not attention_mask.all() else None
        if position_ids is None and padding is not None:
            position_ids = positions_from_mask(attention_mask)
        logits, _ = self.model(input_ids, padding_mask=padding, positions=position_ids)
        loss = None
        if labels is not None:  # the usual shift: position t predicts token t + 1
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutput(loss=loss, logits=logits)

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **kwargs):
        """No cache: the whole (cropped) sequence each step, with its padding mask and the positions it implies."""
        window = self.config.max_position_embeddings
        inputs = {"input_ids": input_ids[:, -window:], "attention_mask": None, "position_ids": None}
        if attention_mask is not None:
            mask = attention_mask[:, -window:]
            inputs |= {"attention_mask": mask, "position_ids": positions_from_mask(mask)}
        return inputs


class NlqForMaskedLM(NlqPreTrainedModel):
    def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
        padding = attention_mask.bool() if attention_mask is not None and not attention_mask.all() else None
        logits, _ = self.model(input_ids, padding_mask=padding)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
        return MaskedLMOutput(loss=loss, logits=logits)
