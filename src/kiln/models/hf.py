"""Hugging Face ``transformers`` architectures, built from config classes with random weights.

Nothing is downloaded: every model is ``SomeModel(SomeConfig(...))``, initialised by the
library's own ``_init_weights`` from torch's global RNG (which ``kiln.models.build`` seeds);
then biases, norm affines and batch-norm statistics are made non-trivial (`_randomize_`).
``transformers`` is imported inside the builders only, so importing kiln never needs it.

Attention is ``attn_implementation="eager"``: matmul / softmax / matmul written out, which
Dynamo and torch.export capture on CPU as plain core-ATen ops for kiln's own passes to fuse.
The library's default, "sdpa", reaches kiln as one call of ATen's fused attention kernel
(`kiln.frontend.kept.KEPT_WHOLE`), which kiln runs as eager does.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
from torch import nn

from ._common import calibrate_batchnorm_

INSTALL_HINT = "pip install -e '.[hf]'"

Built = tuple[nn.Module, tuple[torch.Tensor, ...]]


class MissingDependency(ImportError, ValueError):
    """A model exists but cannot be built here, for want of a package; the message says how to
    install it. Also a ValueError, so callers that check model names (``models.get``) catch it
    as they catch an unknown name."""


def transformers_module() -> ModuleType:
    """``import transformers``, or an error that says how to install it."""
    try:
        return importlib.import_module("transformers")
    except ImportError as err:
        raise MissingDependency(
            f"the HF models need the transformers package ({err}); install it with: "
            f"{INSTALL_HINT}"
        ) from err


def available() -> bool:
    """Whether ``transformers`` can be found, without importing it (that takes seconds)."""
    try:
        return importlib.util.find_spec("transformers") is not None
    except (ImportError, ValueError):  # a None or spec-less entry in sys.modules
        return False


class TensorOutput(nn.Module):
    """Calls an HF model for tuple outputs and returns the first one, a plain tensor.

    kiln's frontends and ``kiln bench`` then treat the model like a built-in one; the outputs
    left unused are dead code for capture and DCE to drop.
    """

    def __init__(self, model: nn.Module, **call_kwargs: Any) -> None:
        super().__init__()
        self.model = model
        self.call_kwargs = call_kwargs  # use_cache=False: no KV-cache object among the outputs

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.model(*inputs, return_dict=False, **self.call_kwargs)[0]


def _randomize_(model: nn.Module, calib_images: torch.Tensor | None = None) -> None:
    """Random biases and norm affines (HF initialises them to 0 and 1), so that bias and norm
    folding are tested with real values, as in the built-in zoo; BN statistics calibrated on
    ``calib_images`` (HF leaves mean 0 / var 1)."""
    for module in model.modules():
        weight, bias = getattr(module, "weight", None), getattr(module, "bias", None)
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            nn.init.uniform_(module.weight, 0.5, 1.5)
            nn.init.normal_(module.bias, 0.0, 0.1)
            continue
        is_norm = "norm" in type(module).__name__.lower()  # LayerNorm, LlamaRMSNorm
        if is_norm and isinstance(weight, nn.Parameter):
            nn.init.normal_(weight, 1.0, 0.1)
        if isinstance(bias, nn.Parameter):
            nn.init.normal_(bias, 0.0, 0.02)
    if calib_images is not None:
        calibrate_batchnorm_(model, calib_images)


def _token_ids(vocab: int, seq: int) -> tuple[torch.Tensor, ...]:
    return (torch.randint(0, vocab, (1, seq), dtype=torch.int64),)


def _images(channels: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One input image and a batch of four to calibrate batch norms on."""
    return torch.randn(1, channels, size, size), torch.randn(4, channels, size, size)


# Quick variants: the same classes, 2 layers (where the config has a depth), tiny widths and
# inputs. Full size is the config class's default where that is the named reference model.
_QUICK_LAYERS = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4)


def build_bert(quick: bool) -> Built:
    t = transformers_module()
    size = dict(_QUICK_LAYERS, intermediate_size=256, vocab_size=512, max_position_embeddings=64)
    config = t.BertConfig(**(size if quick else {}), attn_implementation="eager")  # bert-base
    model = t.BertModel(config, add_pooling_layer=False)
    _randomize_(model)
    return TensorOutput(model), _token_ids(config.vocab_size, 16 if quick else 128)


def build_gpt2(quick: bool) -> Built:
    t = transformers_module()
    # bos/eos inside the small vocabulary, or the config warns
    size = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=64, bos_token_id=0,
                eos_token_id=0) if quick else {}
    # default: gpt2 (124M); "gelu_new" is GPT-2's tanh approximation of GELU
    config = t.GPT2Config(**size, activation_function="gelu_new", attn_implementation="eager")
    model = t.GPT2LMHeadModel(config)  # lm_head tied to the token embedding
    _randomize_(model)
    return TensorOutput(model, use_cache=False), _token_ids(config.vocab_size, 16 if quick else 128)


def build_vit(quick: bool) -> Built:
    t = transformers_module()
    size = dict(_QUICK_LAYERS, intermediate_size=256, image_size=32, patch_size=8) if quick else {}
    config = t.ViTConfig(**size, attn_implementation="eager")  # default: vit-base-patch16-224
    model = t.ViTModel(config, add_pooling_layer=False)
    _randomize_(model)
    return TensorOutput(model), (torch.randn(1, 3, config.image_size, config.image_size),)


def build_resnet50(quick: bool) -> Built:
    t = transformers_module()
    size = dict(embedding_size=16, hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 1, 1])
    config = t.ResNetConfig(**(size if quick else {}), num_labels=10 if quick else 1000)
    model = t.ResNetForImageClassification(config)  # default config: ResNet-50 (bottleneck)
    image, calib = _images(3, 32 if quick else 224)
    _randomize_(model, calib)
    return TensorOutput(model), (image,)


def build_mobilenet_v2(quick: bool) -> Built:
    t = transformers_module()
    # the config has no depth: quick keeps all 17 blocks and narrows them
    size = dict(depth_multiplier=0.35, image_size=32) if quick else {}
    config = t.MobileNetV2Config(**size)  # default: mobilenet_v2_1.0_224
    model = t.MobileNetV2Model(config)
    image, calib = _images(3, config.image_size)
    _randomize_(model, calib)
    return TensorOutput(model), (image,)


def build_whisper_encoder(quick: bool) -> Built:
    t = transformers_module()
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    if quick:
        size = dict(d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=256,
                    num_mel_bins=16, max_source_positions=32)
    else:  # whisper-base; 80 mel bins and 1500 positions are the config's defaults
        size = dict(d_model=512, encoder_layers=6, encoder_attention_heads=8, encoder_ffn_dim=2048)
    config = t.WhisperConfig(**size, attn_implementation="eager")
    # WhisperModel(config).encoder is a WhisperEncoder; built alone, it skips the decoder and
    # its 26M-parameter token embedding. It takes exactly 2 * max_source_positions frames.
    model = WhisperEncoder(config)
    _randomize_(model)
    frames = 2 * config.max_source_positions
    return TensorOutput(model), (torch.randn(1, config.num_mel_bins, frames),)


def build_llama(quick: bool, tokens: int = 128) -> Built:
    t = transformers_module()
    if quick:
        size = dict(_QUICK_LAYERS, intermediate_size=172, num_key_value_heads=2, vocab_size=512,
                    max_position_embeddings=64)
    else:  # a small Llama-style decoder: grouped-query attention, RMSNorm, SwiGLU, RoPE
        size = dict(num_hidden_layers=4, hidden_size=512, num_attention_heads=8,
                    num_key_value_heads=4, intermediate_size=1376, vocab_size=32000,
                    max_position_embeddings=max(512, tokens))
    config = t.LlamaConfig(**size, attn_implementation="eager")
    model = t.LlamaModel(config)
    _randomize_(model)
    return TensorOutput(model, use_cache=False), _token_ids(config.vocab_size,
                                                            16 if quick else tokens)


class DecodeStep(nn.Module):
    """One step of token-by-token generation: the new token's ids and each layer's cached
    keys and values (``kv``: k0, v0, k1, v1, ...) in, the new token's hidden state out.

    The cache is HF's own ``DynamicCache``, filled from the tensors inside the call, so the
    layers grow it as generation does (a cat onto each layer's keys and values) and a
    capture sees plain tensors.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.cache_class = transformers_module().DynamicCache  # (not looked up in a trace)
        # transformers 5 names the argument ``cache``; 4 ``past_key_values``
        self.cache_argument = ("cache" if "cache" in inspect.signature(model.forward).parameters
                               else "past_key_values")

    def forward(self, ids: torch.Tensor, *kv: torch.Tensor) -> torch.Tensor:
        cache = self.cache_class()
        for layer in range(len(kv) // 2):
            cache.update(kv[2 * layer], kv[2 * layer + 1], layer)
        past = kv[0].shape[2]
        positions = torch.arange(past, past + ids.shape[1]).unsqueeze(0)
        return self.model(ids, position_ids=positions, use_cache=True, return_dict=False,
                          **{self.cache_argument: cache})[0]


def build_llama_decode(quick: bool) -> Built:
    """hf_llama's model generating: one new token over a cache of 127 (quick: 15)."""
    model, _ = build_llama(quick)
    llama = model.model
    config = llama.config
    past = 15 if quick else 127
    head_dim = config.hidden_size // config.num_attention_heads
    kv = [torch.randn(1, config.num_key_value_heads, past, head_dim)
          for _ in range(2 * config.num_hidden_layers)]
    return DecodeStep(llama), (*_token_ids(config.vocab_size, 1), *kv)


def build_t5_encoder(quick: bool) -> Built:
    t = transformers_module()
    # quick: 2 layers of 4 heads; T5's relative position buckets stay at the default 32
    size = dict(d_model=64, d_kv=16, d_ff=256, num_layers=2, num_heads=4,
                vocab_size=512) if quick else {}
    config = t.T5Config(**size, attn_implementation="eager")  # default: t5-small
    # T5EncoderModel: the shared embedding and the encoder stack, no decoder. Attention has
    # no 1/sqrt(d) scale and a learned relative position bias (first layer), the norm is
    # T5LayerNorm (RMS, no bias), the feed-forward is relu, the linears have no bias.
    model = t.T5EncoderModel(config)
    _randomize_(model)
    return TensorOutput(model), _token_ids(config.vocab_size, 16 if quick else 128)


def build_convnext(quick: bool) -> Built:
    t = transformers_module()
    # quick: two stages of one block each (stem, block, downsampling layer, pooler, head);
    # all four cost 50% more compile time and add nothing new
    size = dict(num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], image_size=32)
    config = t.ConvNextConfig(**(size if quick else {}), num_labels=10 if quick else 1000)
    model = t.ConvNextForImageClassification(config)  # default config: convnext-tiny-224
    _randomize_(model)
    for module in model.modules():  # layer scale starts at 1e-6: each block ~ the identity
        scale = getattr(module, "layer_scale_parameter", None)
        if isinstance(scale, nn.Parameter):
            nn.init.uniform_(scale, 0.1, 1.0)
    return TensorOutput(model), (torch.randn(1, 3, config.image_size, config.image_size),)


def build_levit(quick: bool) -> Built:
    t = transformers_module()
    # a convolution stem (hardswish between its NHWC convolutions), attention whose values
    # are twice as long as its keys (attention ratio 2) with learned biases it caches per
    # device as it runs, and shrinking attention between stages
    size = dict(image_size=128, hidden_sizes=[16, 32, 48], num_attention_heads=[2, 2, 2],
                depths=[1, 1, 1], key_dim=[8, 8, 8], mlp_ratio=[2, 2, 2],
                down_ops=[["Subsample", 8, 16 // 8, 4, 2, 2], ["Subsample", 8, 32 // 8, 4, 2, 2]]
                ) if quick else {}
    config = t.LevitConfig(**size)  # default: LeViT-128S, 3x224x224
    model = t.LevitModel(config)
    # batch norms left at mean 0 / var 1: calibrated on four images, the model amplified
    # float32 rounding until eager was off a float64 run by half its output's range
    _randomize_(model)
    return TensorOutput(model), (torch.randn(1, 3, config.image_size, config.image_size),)


def build_falcon(quick: bool) -> Built:
    t = transformers_module()
    # multi-query attention (one key / value head for all query heads: a 0 stride in the
    # attention products), attention and MLP in parallel from one layer norm, rotary
    size = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=512,
                max_position_embeddings=64) if quick else \
        dict(num_hidden_layers=4, hidden_size=512, num_attention_heads=8, vocab_size=32000)
    config = t.FalconConfig(**size, multi_query=True, attn_implementation="eager")
    model = t.FalconModel(config)
    _randomize_(model)
    return TensorOutput(model, use_cache=False), _token_ids(config.vocab_size, 16 if quick else 128)


def build_deberta(quick: bool) -> Built:
    t = transformers_module()
    # disentangled attention: content and relative-position scores (c2p, p2c) gathered from
    # a relative embedding, the key divided by its scale before the product
    size = dict(_QUICK_LAYERS, intermediate_size=256, vocab_size=512,
                max_position_embeddings=64, position_buckets=8) if quick else \
        dict(num_hidden_layers=6, hidden_size=768, num_attention_heads=12,
             intermediate_size=3072, position_buckets=256, max_relative_positions=-1)
    config = t.DebertaV2Config(**size, relative_attention=True, pos_att_type=["p2c", "c2p"],
                               norm_rel_ebd="layer_norm", attn_implementation="eager")
    model = t.DebertaV2Model(config)
    _randomize_(model)
    return TensorOutput(model), _token_ids(config.vocab_size, 16 if quick else 128)


# name -> (builder, one-line description of the full-size model); kiln.models registers them
BUILDERS: dict[str, tuple[Callable[[bool], Built], str]] = {
    "hf_bert": (
        build_bert,
        "HF BertModel, BERT-base: 12 layers, hidden 768, seq 128, batch 1 (hidden states)",
    ),
    "hf_gpt2": (
        build_gpt2,
        "HF GPT2LMHeadModel, GPT-2 small: 12 layers, hidden 768, seq 128, batch 1 (logits)",
    ),
    "hf_vit": (
        build_vit,
        "HF ViTModel, ViT-B/16: 12 layers, hidden 768, 3x224x224, batch 1 (hidden states)",
    ),
    "hf_resnet50": (
        build_resnet50,
        "HF ResNetForImageClassification, ResNet-50, 3x224x224, batch 1 (logits)",
    ),
    "hf_mobilenet_v2": (
        build_mobilenet_v2,
        "HF MobileNetV2Model, width 1.0, 3x224x224, batch 1 (last feature map, 1280x7x7)",
    ),
    "hf_whisper_encoder": (
        build_whisper_encoder,
        "HF Whisper encoder, whisper-base: 6 layers, d_model 512, 80 mel x 3000 frames, batch 1",
    ),
    "hf_llama": (
        build_llama,
        "HF LlamaModel: 4 layers, hidden 512, 8 heads (4 kv), seq 128, batch 1 (hidden states)",
    ),
    "hf_llama_1k": (
        functools.partial(build_llama, tokens=1024),
        "HF LlamaModel as hf_llama, seq 1024: a long prompt's prefill (causal attention, about a "
        "quarter of the FLOPs, half of them skipped)",
    ),
    "hf_llama_decode": (
        build_llama_decode,
        "HF LlamaModel as hf_llama, generating: one token over a 127-token KV cache "
        "(DynamicCache), batch 1 (its hidden state)",
    ),
    "hf_t5_encoder": (
        build_t5_encoder,
        "HF T5EncoderModel, t5-small: 6 layers, d_model 512, seq 128, batch 1 (hidden states)",
    ),
    "hf_convnext": (
        build_convnext,
        "HF ConvNextForImageClassification, ConvNeXt-T, 3x224x224, batch 1 (logits)",
    ),
    "hf_levit": (
        build_levit,
        "HF LevitModel, LeViT-128S: conv stem, 3 attention stages, 3x224x224, batch 1",
    ),
    "hf_falcon": (
        build_falcon,
        "HF FalconModel: 4 layers, hidden 512, 8 heads, multi-query, seq 128, batch 1",
    ),
    "hf_deberta": (
        build_deberta,
        "HF DebertaV2Model, DeBERTa-v3-base layout: 6 layers, hidden 768, seq 128, batch 1",
    ),
}
