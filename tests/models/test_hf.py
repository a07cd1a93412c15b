"""The HF architectures of kiln.models (quick variants, so the file runs in seconds)."""

from __future__ import annotations

import sys

import pytest
import torch

from kiln import models
from kiln.cli import main
from kiln.models import hf

HF_NAMES = [
    "hf_bert",
    "hf_gpt2",
    "hf_vit",
    "hf_resnet50",
    "hf_mobilenet_v2",
    "hf_whisper_encoder",
    "hf_llama",
    "hf_llama_1k",
    "hf_llama_decode",
    "hf_t5_encoder",
    "hf_convnext",
    "hf_levit",
    "hf_falcon",
    "hf_deberta",
]

# (input shapes, output shape) of the quick variants
QUICK_SHAPES = {
    "hf_bert": ([(1, 16)], (1, 16, 64)),
    "hf_gpt2": ([(1, 16)], (1, 16, 512)),  # logits over the 512-token vocabulary
    "hf_vit": ([(1, 3, 32, 32)], (1, 17, 64)),  # 16 patches + cls
    "hf_resnet50": ([(1, 3, 32, 32)], (1, 10)),
    "hf_mobilenet_v2": ([(1, 3, 32, 32)], (1, 1280, 1, 1)),
    "hf_whisper_encoder": ([(1, 16, 64)], (1, 32, 64)),  # the second conv halves the frames
    "hf_llama": ([(1, 16)], (1, 16, 64)),
    "hf_llama_1k": ([(1, 16)], (1, 16, 64)),  # (the quick one is hf_llama's)
    # one token over 15 cached: ids, then keys and values of 2 layers (2 kv heads of 16)
    "hf_llama_decode": ([(1, 1)] + [(1, 2, 15, 16)] * 4, (1, 1, 64)),
    "hf_t5_encoder": ([(1, 16)], (1, 16, 64)),
    "hf_convnext": ([(1, 3, 32, 32)], (1, 10)),
    "hf_levit": ([(1, 3, 128, 128)], (1, 4, 48)),  # 8x8 tokens, subsampled twice
    "hf_falcon": ([(1, 16)], (1, 16, 64)),
    "hf_deberta": ([(1, 16)], (1, 16, 64)),
}


@pytest.fixture
def transformers():
    return pytest.importorskip("transformers")


def _run(
    name: str, seed: int = 0
) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], torch.Tensor]:
    model, inputs = models.build(name, quick=True, seed=seed)
    with torch.no_grad():
        out = model(*inputs)
    return model, inputs, out


def test_names_follow_the_builtin_ones(transformers) -> None:
    assert models.names(models.Origin.HF) == HF_NAMES
    assert models.names() == models.names(models.Origin.BUILTIN) + HF_NAMES
    for name in HF_NAMES:
        spec = models.get(name)
        assert spec.origin is models.Origin.HF and spec.available()
        assert spec.description.startswith("HF ") and "\n" not in spec.description


@pytest.mark.parametrize("name", HF_NAMES)
def test_quick_forward(name: str, transformers) -> None:
    model, inputs, out = _run(name)
    input_shapes, output_shape = QUICK_SHAPES[name]
    assert [tuple(x.shape) for x in inputs] == input_shapes
    assert not model.training
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert type(out) is torch.Tensor  # not a ModelOutput or a tuple
    assert tuple(out.shape) == output_shape and out.dtype == torch.float32
    assert torch.isfinite(out).all()
    assert 1e-3 < out.std().item() < 1e3  # neither exploded nor collapsed


@pytest.mark.parametrize("name", HF_NAMES)
def test_deterministic_and_seed_dependent(name: str, transformers) -> None:
    _, inputs_a, out_a = _run(name, seed=0)
    _, inputs_b, out_b = _run(name, seed=0)
    for a, b in zip(inputs_a, inputs_b, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(out_a, out_b)
    _, _, out_c = _run(name, seed=1)
    assert not torch.allclose(out_a, out_c)


@pytest.mark.parametrize("name", ["hf_bert", "hf_gpt2", "hf_vit", "hf_whisper_encoder",
                                  "hf_llama", "hf_t5_encoder", "hf_falcon", "hf_deberta"])
def test_attention_is_eager_and_norms_are_random(name: str, transformers) -> None:
    model, _ = models.build(name, quick=True)
    assert model.model.config._attn_implementation == "eager"
    norms = [m for m in model.modules() if "norm" in type(m).__name__.lower()]
    assert norms
    for norm in norms:  # HF initialises them to 1 (and 0): folding them would be trivial
        assert not torch.allclose(norm.weight, torch.ones_like(norm.weight))


def test_architecture_details(transformers) -> None:
    gpt2, _ = models.build("hf_gpt2", quick=True)
    assert gpt2.model.config.activation_function == "gelu_new"  # tanh GELU
    assert gpt2.model.lm_head.weight is gpt2.model.transformer.wte.weight  # tied
    llama, _ = models.build("hf_llama", quick=True)
    config = llama.model.config
    assert config.num_key_value_heads < config.num_attention_heads  # grouped-query attention
    assert type(llama.model.rotary_emb).__name__ == "LlamaRotaryEmbedding"  # RoPE
    t5, _ = models.build("hf_t5_encoder", quick=True)
    assert type(t5.model).__name__ == "T5EncoderModel"
    assert t5.model.encoder.block[0].layer[0].SelfAttention.has_relative_attention_bias
    convnext, _ = models.build("hf_convnext", quick=True)
    scales = [m.layer_scale_parameter for m in convnext.modules()
              if getattr(m, "layer_scale_parameter", None) is not None]
    assert scales and all(s.min() >= 0.1 for s in scales)  # not the 1e-6 that mutes a block
    levit, _ = models.build("hf_levit", quick=True)
    attention = levit.model.encoder.stages[0].layers[0].module
    assert attention.out_dim_projection == 2 * attention.key_dim * attention.num_attention_heads
    falcon, _ = models.build("hf_falcon", quick=True)
    assert falcon.model.config.multi_query  # one key / value head for all query heads
    deberta, _ = models.build("hf_deberta", quick=True)
    assert deberta.model.config.relative_attention and "c2p" in deberta.model.config.pos_att_type


@pytest.mark.parametrize("name", ["hf_resnet50", "hf_mobilenet_v2"])
def test_batchnorm_state_is_nontrivial(name: str, transformers) -> None:
    model, _ = models.build(name, quick=True)
    bns = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bns
    for bn in bns:
        assert bn.running_mean.abs().max() > 0
        assert not torch.allclose(bn.running_var, torch.ones_like(bn.running_var))
        assert not torch.allclose(bn.weight, torch.ones_like(bn.weight))


# The full-size builds that take well under a second (BERT and GPT-2 take seconds each).
@pytest.mark.parametrize("name, input_shape, params_m", [
    ("hf_mobilenet_v2", (1, 3, 224, 224), 2.2),
    ("hf_whisper_encoder", (1, 80, 3000), 20.6),
    ("hf_llama", (1, 128), 28.0),
    ("hf_llama_1k", (1, 1024), 28.0),
    ("hf_llama_decode", (1, 1), 28.0),
    ("hf_convnext", (1, 3, 224, 224), 28.6),  # ConvNeXt-T; T5's embedding takes 5 s to build
    ("hf_levit", (1, 3, 224, 224), 8.4),  # LeViT-128S
])
def test_full_size_builds(name: str, input_shape: tuple[int, ...], params_m: float,
                          transformers) -> None:
    model, inputs = models.build(name)
    assert tuple(inputs[0].shape) == input_shape  # (a decode step: then its KV cache)
    assert sum(p.numel() for p in model.parameters()) / 1e6 == pytest.approx(params_m, abs=0.1)


def test_clear_error_without_transformers(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` now fails
    assert not hf.available()
    assert models.names() == models.names(models.Origin.BUILTIN)
    assert models.names(models.Origin.HF) == []
    for call in (lambda: models.get("hf_bert"), lambda: models.build("hf_llama", quick=True),
                 hf.transformers_module):
        with pytest.raises(models.MissingDependency, match=r"pip install -e '\.\[hf\]'"):
            call()
    with pytest.raises(ImportError):  # it is one, and a ValueError like an unknown name
        models.get("hf_bert")
    with pytest.raises(ValueError, match="unknown model"):
        models.get("hf_no_such_model")
    assert main(["bench", "--models", "hf_gpt2", "--quick"]) == 2  # a usage error, no traceback
    err = capsys.readouterr().err
    assert err.startswith("kiln: error: ") and "pip install -e '.[hf]'" in err
