"""A decode pass over a Llama model's weights without its modules: the same ops, less Python.

A decode step of a small model on the CPU is bound by the host: transformers' modules cost
more than their kernels (the bench's 30-layer random Llama at batch 1: about 60 module
calls, decorators and keyword passes a layer around some 40 aten ops; a cProfile of the
engine thread put 16% of a step in the linear layers). `LeanLlama.forward` runs what
`LlamaForCausalLM.forward` runs for a pass of one token a row, op for op (the same RMSNorm,
rotary embedding, projections, the model's own attention function and KV cache layers), so
its logits are the model's to the bit (tests/server/test_lean.py), and only that: the
embedding, each layer's norm, attention and MLP, the final norm and the output projection
of the last position.

It runs only where that is exactly the model's forward: a `LlamaForCausalLM` (the embedded
SmolLM2 is one) in eval mode, one token a row, a prepared 4D mask (transformers passes one
as it is). Any other model or pass runs the model's forward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from gclm.server.engine.transformers.cpu_linear import PackedLinear

_pointwise = torch.ops.mkldnn._linear_pointwise


class LeanLlama:
    """`forward` for decode passes of a LlamaForCausalLM; `of(model)` is None for others."""

    def __init__(self, model: Any) -> None:
        inner = model.model
        self.config = inner.config
        self.embed = inner.embed_tokens
        self.rotary = inner.rotary_emb
        self.norm = _norm(inner.norm)
        self.head = _linear_of(model.lm_head)
        self.layers = [
            _Layer(layer, index)
            for index, layer in enumerate(inner.layers[: self.config.num_hidden_layers])
        ]

    @classmethod
    def of(cls, model: Any) -> LeanLlama | None:
        try:
            from transformers.models.llama.modeling_llama import LlamaForCausalLM
        except ImportError:  # pragma: no cover - transformers without Llama
            return None
        if type(model) is not LlamaForCausalLM or model.training:
            return None
        return cls(model)

    def forward(
        self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        """Logits [n, 1, V] after `ids` [n, 1] at `positions` [n, 1], attending through the
        additive `mask` [n, 1, 1, W]; each layer's keys and values go through `cache`'s
        layers, as the model's forward sends them."""
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        from transformers.models.llama.modeling_llama import eager_attention_forward

        attention = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        hidden = F.embedding(ids, self.embed.weight, self.embed.padding_idx)  # [n, 1, H]
        cos, sin = self.rotary(hidden, position_ids=positions)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [n, 1, 1, D]
        for layer in self.layers:
            hidden = layer.forward(hidden, cos, sin, mask, cache, attention)
        hidden = self.norm(hidden)
        return self.head(hidden)  # [n, 1, V]


class _Layer:
    """One LlamaDecoderLayer's weights and its forward for one token a row."""

    def __init__(self, layer: Any, index: int) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.index = index
        self.module = attn  # the attention function reads its flags (is_causal, ...)
        self.head_dim = attn.head_dim
        self.scaling = attn.scaling
        self.q, self.k, self.v, self.o = map(
            _linear_of, (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
        )
        self.gate, self.up, self.down = map(_linear_of, (mlp.gate_proj, mlp.up_proj, mlp.down_proj))
        self.act = mlp.act_fn
        self.input_norm = _norm(layer.input_layernorm)
        self.post_norm = _norm(layer.post_attention_layernorm)

    def forward(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        cache: Any,
        attention: Any,
    ) -> torch.Tensor:
        shape = (*hidden.shape[:-1], -1, self.head_dim)
        x = self.input_norm(hidden)
        q = self.q(x).view(shape).transpose(1, 2)  # [n, heads, 1, D]
        k = self.k(x).view(shape).transpose(1, 2)
        v = self.v(x).view(shape).transpose(1, 2)
        q = (q * cos) + (_rotate_half(q) * sin)
        k = (k * cos) + (_rotate_half(k) * sin)
        k, v = cache.layers[self.index].update(k, v)
        out, _ = attention(self.module, q, k, v, mask, dropout=0.0, scaling=self.scaling)
        hidden = hidden + self.o(out.reshape(*hidden.shape[:-1], -1).contiguous())
        x = self.post_norm(hidden)
        return hidden + self.down(self.act(self.gate(x)) * self.up(x))


def _linear_of(module: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """The module's product without its module call: F.linear over an nn.Linear's weight,
    oneDNN's over a PackedLinear's (cpu_linear.py), the module itself otherwise."""
    if type(module) is nn.Linear:
        weight, bias = module.weight, module.bias
        return lambda x: F.linear(x, weight, bias)
    if type(module) is PackedLinear:
        packed, bias = module.packed, module.bias
        return lambda x: _pointwise(x, packed, bias, "none", [], "")
    return module


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _norm(module: Any) -> Any:
    """LlamaRMSNorm's forward over its weight and epsilon."""
    weight, eps = module.weight, module.variance_epsilon

    def norm(hidden: torch.Tensor) -> torch.Tensor:
        dtype = hidden.dtype
        x = hidden.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + eps)
        return weight * x.to(dtype)

    return norm
