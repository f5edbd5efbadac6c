"""The Transformer, in one file: a pre-LN GPT (causal=True) or a bidirectional encoder (causal=False).

The research axis is which projection (projections.py) computes the query — and, beyond the paper, the
key, value and attention output. Keys and values default to one linear d -> 2 d_kv projection.
LLaMA-style options: QK-norm, rotary positions, grouped-query attention; a KV cache for incremental decoding.

lines: the whole model stays in this one file, as nanoGPT keeps it: it reads top to bottom, and `nlq export`
ships it as it is (with components.py: the classifier's stem and head, the LM head's loss, the KV cache) into a
Hugging Face directory (interop/remote), where the exported model runs this very code.
"""

from __future__ import annotations

import hashlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from nlq.components import (
    ClassHead,
    DifferentialLambda,
    KVCache,
    LayerCache,
    PatchStem,
    check_input,
    differential_heads,
    head_loss,
    lambda_init,
)
from nlq.config import ModelConfig
from nlq.projections import build_projection


def rotary_tables(head_size: int, length: int, theta: float, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position x frequency, each (length, head_size / 2)."""
    freqs = theta ** (-torch.arange(0, head_size, 2, device=device, dtype=torch.float32) / head_size)
    angles = torch.outer(torch.arange(length, device=device, dtype=torch.float32), freqs)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[i], x[i + hs/2]) of x (B, h, T, hs) by position-dependent angles (GPT-NeoX layout)."""
    half = x.size(-1) // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_size = cfg.n_head, cfg.kv_heads, cfg.head_size
        self.causal, self.impl, self.dropout = cfg.causal, cfg.attn_impl, cfg.dropout
        names = cfg.placements
        self.q_proj = build_projection(names["q"], cfg)
        self.kv_dim = cfg.kv_heads * cfg.head_size
        if names["k"] == names["v"] == "linear":
            self.kv_proj = nn.Linear(cfg.n_embd, 2 * self.kv_dim, bias=cfg.bias)  # one d -> 2 d_kv matmul
        else:
            self.k_proj, self.v_proj = build_projection(names["k"], cfg), build_projection(names["v"], cfg)
        if names["o"] == "linear":  # the standard output projection: a plain d -> d matmul into the residual stream
            self.o_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
            self.o_proj.is_residual_output = True
        else:
            self.o_proj = build_projection(names["o"], cfg)
        if cfg.gate_width:  # the output gate's logits X W_g: (B, T, d) elementwise, (B, T, nh) headwise
            self.gate_proj = nn.Linear(cfg.n_embd, cfg.gate_width, bias=False)
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm:
            self.q_norm = nn.RMSNorm(cfg.head_size, eps=cfg.norm_eps)
            self.k_norm = nn.RMSNorm(cfg.head_size, eps=cfg.norm_eps)
        # The projections' 1/2 (Q = (X + f(X)) / 2) lives in the softmax scale, except under QK-norm,
        # which must see the halved q and k (its eps makes the norm not quite scale-free).
        multiplier = self.q_proj.query_scale
        if not cfg.qk_norm:
            multiplier *= self.q_proj.output_scale * self._k_output_scale()
        self.scale = cfg.attn_scale or multiplier / math.sqrt(cfg.head_size)
        # Differential attention (components.differential_heads) or its norm alone on softmax heads (a control)
        self.differential, self.out_norm = cfg.attention == "differential", cfg.attn_out_norm
        self.norm_eps = cfg.norm_eps
        if self.differential:
            self.lambdas = DifferentialLambda(cfg.head_size, layer)
        self.lambda_init = lambda_init(layer)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.attention_maps: list | None = None  # a list: each softmax map (B, h, T, T_k) is kept (diagnostics.py)
        self.fused_input = True  # one matmul for q, k, v (False: one per projection; tests compare the two)

    def _k_output_scale(self) -> float:
        return self.k_proj.output_scale if hasattr(self, "k_proj") else 1.0

    def _input_projections(self) -> list[nn.Module]:
        """q, then kv (or k and v), then the output gate's logits where there is a gate: all read x."""
        inputs = [self.q_proj, self.kv_proj] if hasattr(self, "kv_proj") else [self.q_proj, self.k_proj, self.v_proj]
        return inputs + [self.gate_proj] if hasattr(self, "gate_proj") else inputs

    def _project_inputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """q, then kv (or k and v), from x (B, T, C). Fused: one matmul X [W_q | W_kv] for all of them (the
        nonlinear query contributes diag(g) W1), each projection then finishes its slice; the same numbers
        as calling each projection, with one larger matmul instead of two or three."""
        projections = self._input_projections()
        if not self.fused_input:
            return [p(x) for p in projections]
        weights = [_input_weight(p) for p in projections]
        present = [w for w in weights if w is not None]
        if not present:  # no first matmul to share (identity q, k and v; projections of your own)
            return [_finish(p, x, None) for p in projections]
        h = F.linear(x, present[0] if len(present) == 1 else torch.cat(present))  # (B, T, sum of widths)
        slices = iter(h.split([w.size(0) for w in present], dim=-1))
        return [_finish(p, x, next(slices) if w is not None else None) for p, w in zip(projections, weights)]

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None,
                rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
                cache: LayerCache | None = None) -> torch.Tensor:
        B, T, C = x.shape
        projected = self._project_inputs(x)
        q = projected[0]  # (B, T, C)
        if hasattr(self, "kv_proj"):
            k, v = projected[1].split(self.kv_dim, dim=2)  # (B, T, d_kv) each
        else:
            k, v = projected[1], projected[2]
            if self.v_proj.output_scale != 1.0:
                v = v * self.v_proj.output_scale
        q = q.view(B, T, self.n_head, self.head_size).transpose(1, 2)  # (B, nh, T, hs)
        k, v = (t.view(B, T, self.n_kv_head, self.head_size).transpose(1, 2) for t in (k, v))  # (B, nkv, T, hs)
        if self.qk_norm:
            q_scale, k_scale = self.q_proj.output_scale, self._k_output_scale()
            q = self.q_norm(q * q_scale if q_scale != 1.0 else q)
            k = self.k_norm(k * k_scale if k_scale != 1.0 else k)
        if rotary is not None:
            q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        if cache is not None:
            k, v = cache.extend(k, v)  # (B, nkv, past + T, hs); attn_mask spans them (Transformer._attention_mask)
        if self.n_kv_head != self.n_head:  # grouped-query attention: each kv head serves n_head / n_kv_head queries
            k, v = (t.repeat_interleave(self.n_head // self.n_kv_head, dim=1) for t in (k, v))  # (B, nh, T, hs)
        dropout = self.dropout if self.training else 0.0

        def attend(q, k, v):  # softmax(q k^T * scale + mask) v: (B, h, T, hs_v)
            if self.impl == "sdpa" and self.attention_maps is None:
                return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout,
                                                      is_causal=self.causal and attn_mask is None, scale=self.scale)
            return self._math_attention(q, k, v, attn_mask, dropout)

        if self.differential:  # (B, nh/2, T, 2 hs): heads j and j + nh/2 as one
            y = differential_heads(attend, q, k, v, self.lambdas(), self.lambda_init, self.norm_eps)
        else:
            y = attend(q, k, v)  # (B, nh, T, hs)
            if self.out_norm:  # the differential head's norm and scale alone
                y = (1 - self.lambda_init) * F.rms_norm(y, (self.head_size,), eps=self.norm_eps)
        y = y.transpose(1, 2)  # (B, T, nh, hs), or (B, T, nh/2, 2 hs)
        if hasattr(self, "gate_proj"):  # Y * sigmoid(X W_g): per element, or one gate per head broadcast over hs
            y = y * torch.sigmoid(projected[-1].view(B, T, self.n_head, -1))
        y = y.contiguous().view(B, T, C)  # (B, T, C)
        out = self.o_proj(y)
        if getattr(self.o_proj, "output_scale", 1.0) != 1.0:
            out = out * self.o_proj.output_scale
        return self.resid_dropout(out)

    def _math_attention(self, q, k, v, attn_mask, dropout):
        """softmax(q k^T * scale + mask) v, written out; the reference the sdpa path must match."""
        T = q.size(-2)
        scores = (q @ k.transpose(-2, -1)) * self.scale  # (B, nh, T, T)
        if self.causal and attn_mask is None:
            attn_mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        if attn_mask is not None:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        probs = scores.softmax(dim=-1)  # (B, nh, T, T)
        if self.attention_maps is not None:
            self.attention_maps.append(probs.detach())
        return F.dropout(probs, p=dropout, training=dropout > 0) @ v  # (B, nh, T, hs)


def _input_weight(projection: nn.Module) -> torch.Tensor | None:
    """The first matmul's weight (out, C) of an input projection; None for identity."""
    return projection.weight if isinstance(projection, nn.Linear) else projection.input_weight()


def _finish(projection: nn.Module, x: torch.Tensor, h: torch.Tensor | None) -> torch.Tensor:
    if isinstance(projection, nn.Linear):
        return h if projection.bias is None else h + projection.bias
    return projection.finish(x, h)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.up = nn.Linear(cfg.n_embd, cfg.mlp_hidden, bias=cfg.bias)
        self.down = nn.Linear(cfg.mlp_hidden, cfg.n_embd, bias=cfg.bias)
        self.down.is_residual_output = True
        self.dropout = nn.Dropout(cfg.dropout)
        self.approximate = "tanh" if cfg.mlp_activation == "gelu_tanh" else "none"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.down(F.gelu(self.up(x), approximate=self.approximate)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=cfg.norm_eps, bias=cfg.bias)
        self.attn = Attention(cfg, layer)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=cfg.norm_eps, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, rotary=None,
                cache: LayerCache | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), attn_mask, rotary, cache)
        return x + self.mlp(self.ln_2(x))


class Transformer(nn.Module):
    """seed: initialise every weight from its own generator, seeded by (seed, parameter name), so that two
    variants built with the same seed share every weight they have in common (embeddings, K/V, output,
    MLP) and differ only where their architectures differ; a paired comparison then measures the
    architecture, not the luck of the draw. None: draw from torch's global generator."""

    def __init__(self, cfg: ModelConfig, seed: int | None = None):
        super().__init__()
        self.cfg = cfg
        if cfg.classes:  # an encoder classifier: a patch stem in, a class head out (components.py)
            self.stem = PatchStem(cfg)
        else:
            self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        if cfg.position == "learned" and not cfg.classes:
            self.pos_emb = nn.Embedding(cfg.block_size, cfg.n_embd)
        elif cfg.position == "rope":  # rotary: positions enter as rotations of q and k, no parameters
            cos, sin = rotary_tables(cfg.head_size, cfg.block_size, cfg.rope_theta)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, layer) for layer in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=cfg.norm_eps, bias=cfg.bias)
        if cfg.classes:
            self.head = ClassHead(cfg)
        else:
            self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
            if cfg.tie_embeddings:
                self.lm_head.weight = self.tok_emb.weight
        own = [name for name, m in self.named_modules() if name and not getattr(m, "default_init", True)]
        for name, module in self.named_modules():
            if not any(name == o or name.startswith(o + ".") for o in own):  # a projection's own init is its own
                self._init_weights(name, module, seed)
        for name in own:
            self._own_init(name, seed)
            for sub in getattr(self.get_submodule(name), "nlq_init", ()):  # named parts that take nlq's init anyway
                for part, module in self.get_submodule(f"{name}.{sub}").named_modules(prefix=f"{name}.{sub}"):
                    self._init_weights(part, module, seed)

    def _own_init(self, name: str, seed: int | None) -> None:
        """A projection that keeps its own initialisation (Projection.default_init False) is built again under torch's
        generator seeded by (seed, its name), and starts from that build: its constructor's init, reproducible and
        the same on every rank, the global generator left as it was."""
        if seed is None:
            return
        module = self.get_submodule(name)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(_seed_of(seed, name))
            fresh = type(module).from_config(self.cfg)
        module.load_state_dict(fresh.state_dict())

    def _init_weights(self, name: str, module: nn.Module, seed: int | None) -> None:
        """GPT-2: N(0, 0.02) everywhere; outputs that add into the residual stream get 0.02 / sqrt(2 L)."""
        generator = None
        drawn = isinstance(module, (nn.Linear, nn.Embedding, DifferentialLambda))  # weights drawn per name
        first = next(module.parameters(recurse=False), None) if drawn else None
        if seed is not None and first is not None and first.device.type != "meta":
            generator = torch.Generator(first.device).manual_seed(_seed_of(seed, name))
        if isinstance(module, DifferentialLambda):
            module.reset(generator)
        if isinstance(module, nn.Linear):
            std = 0.02 / math.sqrt(2 * self.cfg.n_layer) if getattr(module, "is_residual_output", False) else 0.02
            nn.init.normal_(module.weight, mean=0.0, std=std, generator=generator)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02, generator=generator)

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        padding_mask: torch.Tensor | None = None,
        ignore_index: int = -100,
        positions: torch.Tensor | None = None,
        loss_impl: str = "plain",
        loss_chunk: int = 512,
        cache: KVCache | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """idx (B, T) token ids; targets (B, T) or None; padding_mask (B, T) bool, True at real tokens;
        positions (B, T) each token's position (left padding shifts them), default 0 .. T - 1.
        Returns logits (B, T, V) and the mean cross-entropy over targets != ignore_index (or None).
        loss_impl (with targets): "plain" builds the logits; "chunked" (PyTorch's F.linear_cross_entropy, rows in
        chunks of loss_chunk) and "liger" (Liger-Kernel's fused kernel, CUDA) never store them and return None.
        cache (a causal model): idx follows the cache.length tokens the cache holds (their keys and values), at
        the positions after them; idx's own are appended (KVCache; generate.py). With a cache, padding_mask
        (B, cache.length + T) covers the cached tokens and idx."""
        if self.cfg.classes:
            return self._classify(idx, targets)
        B, T = idx.shape
        past = 0 if cache is None else cache.length
        if past + T > self.cfg.block_size:
            raise ValueError(f"sequence of {past + T} tokens is longer than model.block_size={self.cfg.block_size}")
        if cache is not None and not self.cfg.causal:
            raise ValueError("a KV cache serves a causal model, not an encoder")
        if padding_mask is not None and padding_mask.shape != (B, past + T):
            raise ValueError(f"padding_mask has shape {tuple(padding_mask.shape)}; it must be (batch, cached + new "
                             f"tokens) = {(B, past + T)}")
        x = self.tok_emb(idx)  # (B, T, C)
        rotary = None
        if positions is None:
            positions = torch.arange(past, past + T, device=idx.device)  # (T,), the same for every row
        if self.cfg.position == "learned":
            x = x + self.pos_emb(positions)
        elif positions.dim() == 1:
            rotary = (self.rope_cos[positions], self.rope_sin[positions])  # (T, hs / 2) each
        else:  # per row: (B, 1, T, hs / 2), broadcast over heads
            rotary = (self.rope_cos[positions][:, None], self.rope_sin[positions][:, None])
        x = self.drop(x)
        attn_mask = self._attention_mask(padding_mask, T, past)
        for i, block in enumerate(self.blocks):
            x = block(x, attn_mask, rotary, None if cache is None else cache.layers[i])
        x = self.ln_f(x)  # (B, T, C)
        if targets is not None and loss_impl != "plain":
            return None, head_loss(x.view(B * T, -1), self.lm_head.weight, targets.reshape(-1), ignore_index,
                                   loss_impl, loss_chunk)
        logits = self.lm_head(x)  # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1),
                                   ignore_index=ignore_index)
        return logits, loss

    def _classify(self, x: torch.Tensor, targets: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """An encoder classifier: x (B, ...) signals or images -> logits (B, classes) and the mean cross-entropy
        against targets (B,) class ids."""
        check_input(x, self.cfg)
        h = self.drop(self.stem(x))  # (B, T, C)
        rotary = (self.rope_cos, self.rope_sin) if self.cfg.position == "rope" else None
        for block in self.blocks:
            h = block(h, None, rotary)  # bidirectional: no mask
        logits = self.head(self.ln_f(h))  # (B, classes)
        loss = None if targets is None else F.cross_entropy(logits.float(), targets)
        return logits, loss

    def _attention_mask(self, padding_mask: torch.Tensor | None, T: int, past: int = 0) -> torch.Tensor | None:
        """Boolean (T, past + T) or, with padding, (B, 1, T, past + T) mask, True where one of the T new queries may
        attend to a key (past cached ones, then the new); None lets sdpa use is_causal."""
        if padding_mask is None and past == 0:
            return None
        device = self.tok_emb.weight.device
        mask = torch.ones(T, past + T, dtype=torch.bool, device=device)
        if self.cfg.causal:
            mask = mask.tril(diagonal=past)  # query i sits at position past + i and sees every key up to it
        if padding_mask is None:
            return mask
        mask = padding_mask[:, None, None, :].bool() & mask  # keys that are real tokens
        # A query row with no visible key (a pad query at the start) would softmax over nothing; let it see itself.
        itself = torch.eye(T, past + T, dtype=torch.bool, device=device).roll(past, dims=1)
        return mask | itself

    # ---- accounting ----------------------------------------------------------------------------------

    def parameter_groups(self) -> dict[str, int]:
        """Parameter counts per module kind (a tied lm_head is counted once, as the token embedding)."""
        groups = {kind: 0 for _, kind in PARAMETER_KINDS} | {"layer norms": 0}
        for name, p in self.named_parameters():  # shared tensors appear once
            groups[_parameter_kind(name)] += p.numel()
        return groups

    def num_parameters(self, non_embedding: bool = True) -> int:
        """Non-embedding parameters exclude the token and position embeddings (the paper's convention)."""
        groups = self.parameter_groups()
        total = sum(groups.values())
        if non_embedding:
            total -= groups["token embedding"] + groups["position embedding"]
        return total

    def flops_per_token(self) -> int:
        """Training FLOPs per token: 6 x (matmul weights incl. the lm_head) + 12 L d T for attention scores and values
        (differential attention: 18 L d T, its two maps weighing values of twice the width)."""
        cfg = self.cfg
        matmul_params = sum(p.numel() for n, p in self.named_parameters()
                            if p.dim() == 2 and "emb" not in n and not n.startswith(("stem.pos", "stem.cls")))
        matmul_params += cfg.vocab_size * cfg.n_embd if cfg.tie_embeddings and not cfg.classes else 0
        attention = 18 if cfg.attention == "differential" else 12
        return 6 * matmul_params + attention * cfg.n_layer * cfg.n_embd * cfg.block_size


def _seed_of(seed: int, name: str) -> int:
    """A generator seed for one module of a model built with `seed`: the same name and seed give the same weights."""
    return int.from_bytes(hashlib.blake2b(f"{seed}/{name}".encode(), digest_size=8).digest(), "little") >> 1


PARAMETER_KINDS = [
    ("tok_emb", "token embedding"), ("pos_emb", "position embedding"), ("stem.pos", "position embedding"),
    ("stem.", "patch stem"), ("head.", "class head"), ("attn.q_proj", "attention query"),
    ("attn.kv_proj", "attention key/value"), ("attn.k_proj", "attention key/value"),
    ("attn.v_proj", "attention key/value"), ("attn.o_proj", "attention output"), ("attn.gate_proj", "attention gate"),
    ("attn.lambdas", "differential lambda"), ("mlp.", "mlp"),
    ("lm_head", "lm head (untied)"),
]


def _parameter_kind(name: str) -> str:
    for key, kind in PARAMETER_KINDS:
        if key in name:
            return kind
    return "layer norms"
