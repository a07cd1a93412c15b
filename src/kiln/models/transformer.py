"""Transformer family: BERT-base encoder, GPT-2 small decoder and ViT-B/16, sharing one block.

Attention is written out explicitly (separate Q/K/V Linears, matmul, * 1/sqrt(head_dim),
softmax, matmul) rather than via a fused qkv or F.scaled_dot_product_attention, because
kiln's passes are meant to discover and perform those fusions themselves.
"""

from __future__ import annotations

import math

import torch
from torch import nn

DESCRIPTION_BERT = "BERT-base encoder, 12 layers, hidden 768, 12 heads, seq 128, batch 1"
DESCRIPTION_GPT2 = (
    "GPT-2 small decoder, 12 layers, hidden 768, 12 heads, seq 128, batch 1 (LM logits)"
)
DESCRIPTION_VIT = "ViT-B/16, 12 layers, hidden 768, 12 heads, 3x224x224, batch 1"


class SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, causal: bool = False, max_len: int = 0) -> None:
        super().__init__()
        assert dim % heads == 0
        self.heads = heads
        self.head_dim = dim // heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)
        self.causal = causal
        if causal:
            # True where attention is allowed; sliced to the (static) sequence length in forward.
            mask = torch.tril(torch.ones(max_len, max_len, dtype=torch.bool))
            self.register_buffer("causal_mask", mask.view(1, 1, max_len, max_len), persistent=False)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self._split(self.q(x)), self._split(self.k(x)), self._split(self.v(x))
        scores = torch.matmul(q, k.transpose(-2, -1)) * self.scale
        if self.causal:
            scores = scores.masked_fill(~self.causal_mask[:, :, :t, :t], float("-inf"))
        attn = torch.softmax(scores, dim=-1)
        out = torch.matmul(attn, v).transpose(1, 2).reshape(b, t, c)
        return self.proj(out)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int, gelu_approximate: str = "none") -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU(approximate=gelu_approximate)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    """Transformer layer; post-LN (BERT) or pre-LN (GPT-2, ViT)."""

    def __init__(
        self,
        dim: int,
        heads: int,
        mlp_dim: int,
        *,
        pre_norm: bool,
        eps: float,
        gelu_approximate: str = "none",
        causal: bool = False,
        max_len: int = 0,
    ) -> None:
        super().__init__()
        self.pre_norm = pre_norm
        self.attn = SelfAttention(dim, heads, causal, max_len)
        self.ln1 = nn.LayerNorm(dim, eps=eps)
        self.mlp = FeedForward(dim, mlp_dim, gelu_approximate)
        self.ln2 = nn.LayerNorm(dim, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.mlp(x))


class Bert(nn.Module):
    """BERT encoder: returns the last hidden states (B, T, dim)."""

    def __init__(
        self, vocab: int, max_len: int, dim: int, layers: int, heads: int, mlp_dim: int
    ) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, dim)
        self.pos_emb = nn.Embedding(max_len, dim)
        self.register_buffer("position_ids", torch.arange(max_len).unsqueeze(0), persistent=False)
        self.emb_ln = nn.LayerNorm(dim, eps=1e-12)
        self.blocks = nn.Sequential(
            *[Block(dim, heads, mlp_dim, pre_norm=False, eps=1e-12) for _ in range(layers)]
        )

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        x = self.tok_emb(input_ids) + self.pos_emb(self.position_ids[:, :t])
        return self.blocks(self.emb_ln(x))


class GPT2(nn.Module):
    """GPT-2 decoder: returns LM logits (B, T, vocab); lm_head is tied to the token embedding."""

    def __init__(self, vocab: int, max_len: int, dim: int, layers: int, heads: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(max_len, dim)
        self.register_buffer("position_ids", torch.arange(max_len).unsqueeze(0), persistent=False)
        self.blocks = nn.Sequential(
            *[
                Block(
                    dim,
                    heads,
                    4 * dim,
                    pre_norm=True,
                    eps=1e-5,
                    gelu_approximate="tanh",
                    causal=True,
                    max_len=max_len,
                )
                for _ in range(layers)
            ]
        )
        self.ln_f = nn.LayerNorm(dim, eps=1e-5)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying, as in the real GPT-2

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        x = self.wte(input_ids) + self.wpe(self.position_ids[:, :t])
        return self.lm_head(self.ln_f(self.blocks(x)))


class ViT(nn.Module):
    """ViT: conv patch embedding, cls token, learned positions; returns class logits."""

    def __init__(
        self,
        image_size: int,
        patch: int,
        dim: int,
        layers: int,
        heads: int,
        mlp_dim: int,
        num_classes: int,
    ) -> None:
        super().__init__()
        num_patches = (image_size // patch) ** 2
        self.patch_embed = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + 1, dim))
        self.blocks = nn.Sequential(
            *[Block(dim, heads, mlp_dim, pre_norm=True, eps=1e-6) for _ in range(layers)]
        )
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(images).flatten(2).transpose(1, 2)  # (B, N, dim)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        x = torch.cat([cls, x], dim=1) + self.pos_embed
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])


def _init(model: nn.Module, std: float = 0.02, residual_std: float | None = None) -> None:
    """BERT/GPT-style N(0, 0.02) init; biases and LayerNorm affine are randomised (not 0/1)
    so that bias/LN fusions and constant folding are exercised with real values."""
    for name, m in model.named_modules():
        if isinstance(m, nn.LayerNorm):
            nn.init.normal_(m.weight, 1.0, 0.1)
            nn.init.normal_(m.bias, 0.0, 0.02)
        elif isinstance(m, (nn.Linear, nn.Embedding, nn.Conv2d)):
            # GPT-2 scales residual-branch output projections by 1/sqrt(2 * layers).
            is_residual = name.endswith(("attn.proj", "mlp.fc2"))
            w_std = residual_std if residual_std is not None and is_residual else std
            nn.init.normal_(m.weight, 0.0, w_std)
            if getattr(m, "bias", None) is not None:
                nn.init.normal_(m.bias, 0.0, 0.02)
    for p in model.parameters(recurse=False):  # ViT cls_token / pos_embed
        nn.init.normal_(p, 0.0, std)


def build_bert(quick: bool) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    if quick:
        vocab, seq, model = 512, 16, Bert(512, 64, dim=64, layers=2, heads=4, mlp_dim=256)
    else:
        vocab, seq, model = 30522, 128, Bert(30522, 512, dim=768, layers=12, heads=12, mlp_dim=3072)
    _init(model)
    input_ids = torch.randint(0, vocab, (1, seq), dtype=torch.int64)
    return model.eval(), (input_ids,)


def build_gpt2(quick: bool) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    if quick:
        vocab, seq, layers, model = 512, 16, 2, GPT2(512, 64, dim=64, layers=2, heads=4)
    else:
        vocab, seq, layers, model = 50257, 128, 12, GPT2(50257, 1024, dim=768, layers=12, heads=12)
    _init(model, residual_std=0.02 / math.sqrt(2 * layers))
    input_ids = torch.randint(0, vocab, (1, seq), dtype=torch.int64)
    return model.eval(), (input_ids,)


def build_vit_b16(quick: bool) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    if quick:
        size, model = 32, ViT(32, patch=8, dim=64, layers=2, heads=4, mlp_dim=256, num_classes=10)
    else:
        size, model = (
            224,
            ViT(224, patch=16, dim=768, layers=12, heads=12, mlp_dim=3072, num_classes=1000),
        )
    _init(model)
    images = torch.randn(1, 3, size, size)
    return model.eval(), (images,)
