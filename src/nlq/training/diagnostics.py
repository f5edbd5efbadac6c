"""Induction diagnostics: how far a language model has formed induction heads, measured during training.

Every train.diagnostics_every steps (and at steps 0 and the last) the model reads one fixed synthetic batch: ROWS
sequences of random tokens, each repeated twice to fill the context (drawn once by a generator of its own, so that
measuring never touches the training RNG stream or the batches; the model runs in eval mode without gradients, so
the weights and the optimizer state are untouched too). Logged into metrics.jsonl as one record per measurement:

    induction_loss_first, induction_loss_second   mean next-token loss on the first copy and on the second (nats)
    icl_score             second - first: the in-context score (about -ln V once a model copies, 0 before)
    prefix_matching       per layer, per head: the mean attention from a token of the second copy to the token after
                          its occurrence in the first copy (the induction head's signature; Olsson et al. 2022)
    prefix_matching_max   the largest of them (runs/transitions.py times the transition by it)
    attn_entropy          per layer: the attention's entropy in nats, averaged over heads, rows and query positions

The maps come from the model's own attention (model.Attention.attention_maps: the explicit softmax, on while
measuring); differential attention's two maps per head pair are read as the nh heads whose queries form them.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from nlq.model import Attention

ROWS = 8
SEED = 20221208  # the synthetic batch's own generator; the same batch for every run of a vocabulary and context


def repeated_tokens(vocab_size: int, length: int, rows: int = ROWS, seed: int = SEED) -> torch.Tensor:
    """(rows, 2 * (length // 2)) token ids: random tokens, then the same tokens again."""
    generator = torch.Generator().manual_seed(seed)
    first = torch.randint(0, vocab_size, (rows, length // 2), generator=generator)  # (rows, half)
    return torch.cat([first, first], dim=1)


def attention_maps(model: torch.nn.Module):
    """A context in which every attention layer keeps its softmax maps; yields {layer index: list of maps}."""
    return _KeptMaps([m for m in model.modules() if isinstance(m, Attention)])


class _KeptMaps:
    def __init__(self, layers: list[Attention]):
        self.layers = layers

    def __enter__(self) -> dict[int, list[torch.Tensor]]:
        for layer in self.layers:
            layer.attention_maps = []
        return {i: layer.attention_maps for i, layer in enumerate(self.layers)}

    def __exit__(self, *exc) -> None:
        for layer in self.layers:
            layer.attention_maps = None


@torch.no_grad()
def induction_record(model: torch.nn.Module, tokens: torch.Tensor, autocast=None) -> dict:
    """The diagnostics of `model` (the bare Transformer) on tokens (B, T) of two equal halves."""
    was_training = model.training
    model.eval()
    try:
        with attention_maps(model) as kept, autocast or contextlib.nullcontext():
            logits, _ = model(tokens)  # (B, T, V)
    finally:
        model.train(was_training)
    B, T = tokens.shape
    half = T // 2
    nll = F.cross_entropy(logits[:, :-1].float().transpose(1, 2), tokens[:, 1:], reduction="none")  # (B, T - 1)
    first, second = nll[:, : half - 1].mean().item(), nll[:, half:].mean().item()  # tokens 1..half-1, half+1..T-1
    queries = torch.arange(half, T, device=tokens.device)  # each token of the second copy ...
    keys = queries - half + 1  # ... and the token after its first occurrence
    prefix, entropy = [], []
    for i in sorted(kept):
        maps = torch.cat(kept[i], dim=1).float()  # (B, nh, T, T): differential's two halves side by side
        prefix.append(maps[:, :, queries, keys].mean(dim=(0, 2)).tolist())  # (nh,)
        entropy.append(-torch.special.xlogy(maps, maps).sum(dim=-1).mean().item())
    return {"induction_loss_first": first, "induction_loss_second": second, "icl_score": second - first,
            "prefix_matching": prefix, "prefix_matching_max": max(max(layer) for layer in prefix),
            "attn_entropy": entropy}


class InductionProbe:
    """The diagnostics of one run: its fixed batch, on the run's device, measured at its cadence."""

    def __init__(self, vocab_size: int, block_size: int, every: int, device: torch.device):
        self.every = every
        self.tokens = repeated_tokens(vocab_size, block_size).to(device)

    def due(self, step: int, last_step: int) -> bool:
        return step % self.every == 0 or step == last_step

    def measure(self, model: torch.nn.Module, step: int, autocast=None) -> dict:
        return {"step": step} | induction_record(model, self.tokens, autocast)
