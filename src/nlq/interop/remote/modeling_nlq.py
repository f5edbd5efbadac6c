"""Hugging Face wrappers around nlq's own Transformer (nlq_model.py beside this file is nlq's model.py,
copied at export with its imports made relative), so an exported model computes exactly what nlq does.
Shipped into the export directory; load with trust_remote_code=True."""

import torch
import torch.nn.functional as F
import transformers
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast, MaskedLMOutput

# Every shipped file is imported here, nlq_model's own imports too: transformers 4.x copies into its module cache
# only the files this module imports itself.
from .configuration_nlq import NlqConfig
from .nlq_components import ClassHead  # noqa: F401
from .nlq_config import ModelConfig, ProjectionsConfig
from .nlq_errors import UserError  # noqa: F401
from .nlq_fields import setting  # noqa: F401
from .nlq_model import Transformer, rotary_tables
from .nlq_projections import build_projection  # noqa: F401

_TIED = ({"model.lm_head.weight": "model.tok_emb.weight"} if int(transformers.__version__.split(".")[0]) >= 5
         else ["model.lm_head.weight"])


# The cache's name in forward's keywords and outputs: `cache` from transformers 5.x on, `past_key_values` before.
_CACHE = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


class _CacheLayer:
    """One layer of a transformers Cache seen as nlq's LayerCache: extend is the Cache's update."""

    def __init__(self, cache, index: int):
        self.cache, self.index = cache, index

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cache.update(k, v, self.index)


class _CacheView:
    """A transformers Cache (DynamicCache: keys and values (B, heads, T, head dim) per layer, as nlq keeps them)
    seen as nlq's KVCache, so nlq's own Transformer reads and fills it."""

    def __init__(self, cache, n_layer: int):
        self.length = cache.get_seq_length()
        self.layers = [_CacheLayer(cache, i) for i in range(n_layer)]


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
    _supports_cache_class = True  # transformers 4.x: generate hands this model a DynamicCache
    _supports_dynamic_cache = True

    def forward(self, input_ids=None, attention_mask=None, labels=None, position_ids=None, use_cache=None,
                token_type_ids=None, **kwargs):
        """With a cache (`cache=` in transformers 5.x, `past_key_values=` before; a new DynamicCache when
        use_cache=True and none is given), input_ids follow the tokens it holds and attention_mask spans both.
        token_type_ids (a 4.x tokenizer's) are ignored: nlq has no segment embeddings."""
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if cache is None and use_cache:
            cache = DynamicCache()
        view = None if cache is None else _CacheView(cache, len(self.model.blocks))
        padding = attention_mask.bool() if attention_mask is not None and not attention_mask.all() else None
        if position_ids is None and padding is not None:
            position_ids = positions_from_mask(attention_mask)[:, -input_ids.shape[1]:]
        logits, _ = self.model(input_ids, padding_mask=padding, positions=position_ids, cache=view)
        loss = None
        if labels is not None:  # the usual shift: position t predicts token t + 1
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{_CACHE: cache})

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, use_cache=True, **kwargs):
        """The tokens the cache does not hold yet, with the padding mask over all of them. Past block_size no
        cache fits (positions start at 0 in the window): from then on the whole window is read afresh each step,
        as `nlq sample` does."""
        cache = kwargs.get("cache", kwargs.get("past_key_values")) if use_cache else None
        window = self.config.max_position_embeddings
        if cache is not None and input_ids.shape[1] <= window:
            inputs = {"input_ids": input_ids[:, cache.get_seq_length():], _CACHE: cache, "use_cache": True}
        else:
            inputs = {"input_ids": input_ids[:, -window:], "use_cache": False}
            attention_mask = None if attention_mask is None else attention_mask[:, -window:]
        return inputs | {"attention_mask": attention_mask}  # forward derives the positions from it


class NlqForMaskedLM(NlqPreTrainedModel):
    def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
        padding = attention_mask.bool() if attention_mask is not None and not attention_mask.all() else None
        logits, _ = self.model(input_ids, padding_mask=padding)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
        return MaskedLMOutput(loss=loss, logits=logits)
