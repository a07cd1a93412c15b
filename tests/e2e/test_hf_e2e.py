"""Every quick HF architecture, compiled both ways at the default opt level, matches eager.

Each case runs with ``strict=True``, so a model kiln cannot compile fails here instead of
falling back to eager (or, for kiln.compile, to Dynamo) with a warning. Unlike the zoo's,
these run without ``debug=True`` (verify after every pass): it adds 40% to the time.
"""

import functools

import pytest
import torch
from torch.export import Dim

import kiln
from kiln import models
from kiln.frontend.dynamo import kiln_backend
from kiln.ir import fused
from kiln.ir.ops import Op
from kiln.report import CompileReport

pytest.importorskip("transformers")

NAMES = models.names(models.Origin.HF)

# ATen ops imported as opaque CALLs (kiln has no op for them), by both frontends alike:
# BertEmbeddings gathers its token type ids from a buffer; GPT-2's and Llama's causal masks are
# built from a cumsum, an index and a bitwise and. All of them read only constants here, so
# constant folding computes them at compile time and no CALL is left in the compiled graph
# (checked below). T5's relative position buckets use full_like, which kiln converts to FULL.
MASK_OPS = {"aten.bitwise_and.Tensor", "aten.cumsum.default", "aten.index.Tensor"}
# Falcon's and DeBERTa's position code (a lifted constant tensor; DeBERTa's relative position
# buckets take the sign, its attention gathers the c2p / p2c scores, Falcon's mask repeats)
EXPECTED_OPAQUE = {"hf_bert": {"aten.gather.default"}, "hf_gpt2": MASK_OPS, "hf_llama": MASK_OPS,
                   "hf_llama_1k": MASK_OPS, "hf_llama_decode": MASK_OPS,
                   "hf_falcon": MASK_OPS | {"aten.lift_fresh_copy.default"},
                   "hf_deberta": {"aten.bitwise_and.Tensor", "aten.gather.default",
                                  "aten.lift_fresh_copy.default", "aten.repeat.default",
                                  "aten.sign.default"},
                   "hf_levit": {"aten.index.Tensor"}}  # its attention biases, by position
# opaque calls left in the compiled graph, on activations: Falcon takes its key and value
# heads out of the fused projection by an index, DeBERTa gathers its relative scores
RUNTIME_CALLS = {"hf_falcon": {"aten.index.Tensor"}, "hf_deberta": {"aten.gather.default"}}

# MobileNetV2's quick variant is ill-conditioned in float32: eager itself is 3.3e-4 off a float64
# run at its largest output (6.0, the relu6 clamp), and kiln's folded batch norms land nearer to
# float64 than eager does. The others match to 1e-5.
ATOL = {"hf_mobilenet_v2": 1e-3}


def _check(got: torch.Tensor, expected: torch.Tensor, name: str) -> None:
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=ATOL.get(name, 1e-4))


def _check_report(report: CompileReport, name: str) -> None:
    assert not report.fallbacks and len(report.graphs) == 1
    graph = report.graphs[0]
    assert set(graph.opaque_ops) <= EXPECTED_OPAQUE.get(name, set())
    # opaque calls are folded at compile time; what is left is kiln's fused attention (and
    # the calls on activations of RUNTIME_CALLS)
    calls = [n.attrs.target for n in graph.details.optimized.nodes if n.op is Op.CALL]
    assert all(t is fused.attention._opoverload or str(t) in RUNTIME_CALLS.get(name, ())
               for t in calls)
    # every generated kernel ran on the operands as they came, none by its library ops
    assert graph.details.fallbacks == {}


@pytest.mark.parametrize("name", NAMES)
def test_torch_compile_backend_matches_eager(name: str) -> None:
    """(``backend="kiln"`` with ``options={"strict": True}`` is the same backend; called
    directly, it hands back its report.)"""
    torch._dynamo.reset()
    model, inputs = models.build(name, quick=True)
    report = CompileReport()
    backend = functools.partial(kiln_backend, options={"strict": True}, report=report)
    fast = torch.compile(model, backend=backend, fullgraph=True)
    with torch.no_grad():
        expected = model(*inputs)
        _check(fast(*inputs), expected, name)
        _check(fast(*inputs), expected, name)  # a second call reuses the plan
    _check_report(report, name)


@pytest.mark.parametrize("name", NAMES)
def test_ahead_of_time_compile_matches_eager(name: str) -> None:
    """(torch.export records each ``.to(dtype)`` of GPT-2, ViT and Llama as
    ``_assert_tensor_metadata``: checked at import against the static types, then dropped.)"""
    model, inputs = models.build(name, quick=True)
    compiled = kiln.compile(model, inputs, kiln.Options(strict=True))  # opt level 2
    with torch.no_grad():
        _check(compiled(*inputs), model(*inputs), name)
    _check_report(compiled.report, name)


def test_sequence_length_left_symbolic_through_torch_export() -> None:
    """Llama (RoPE, grouped-query attention, causal mask) exported with a symbolic sequence
    length: one compiled model, specialized per length on first use."""
    model, (ids,) = models.build("hf_llama", quick=True)  # 16 tokens, 64 positions
    seq = Dim("seq", max=64)
    compiled = kiln.compile(model, (ids,), kiln.Options(strict=True),
                            dynamic_shapes=(({1: seq},),))  # forward(*inputs)
    with torch.no_grad():
        for length in (16, 9):
            ids = torch.randint(0, 512, (1, length))
            _check(compiled(ids), model(ids), "hf_llama")
    assert len(compiled.report.graphs) == 2 and not compiled.report.fallbacks
    with pytest.raises(ValueError, match=r"<= 64"):
        compiled(torch.randint(0, 512, (1, 65)))


@pytest.mark.parametrize("name", ["hf_llama", "hf_t5_encoder"])
def test_each_rms_norm_runs_as_one_row_kernel(name: str) -> None:
    """Llama and T5 write RMSNorm out in arithmetic (pow, mean, add, rsqrt, mul, mul): each
    one, with the residual sum before it, is one generated row kernel."""
    model, inputs = models.build(name, quick=True)
    compiled = kiln.compile(model, inputs, kiln.Options(strict=True))
    with torch.no_grad():
        _check(compiled(*inputs), model(*inputs), name)
    graph = compiled.report.graphs[0]
    means = [n for n in graph.details.optimized.nodes if n.op is Op.MEAN]
    norms = [k for k in graph.kernels if "mean" in k.ops]
    assert len(means) == len(norms) > 2
    assert all(k.kind == "generated" and {"pow", "rsqrt", "mul"} <= set(k.ops) for k in norms)


class _MaskByName(torch.nn.Module):
    """An HF model called with its attention mask by name (GPT-J's second positional
    parameter is the KV cache), its cache on as by default (GPT-J's sdpa mask then hides
    every key from a row of padding only; without a cache it does not)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, attention_mask=mask)[0]


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("name", ["bert", "llama", "gptj"])
def test_a_padded_batch_runs_the_generated_attention(name: str, implementation: str) -> None:
    """Two sequences, the second padded (attention_mask 0 past its tenth token), through both
    of HF's attention paths: the mask, computed from the input at run time, is read by the
    generated attention kernel (the model's own fused call, or the attention pass's), and
    every position matches eager; so it does where the second is padding only (GPT-J's sdpa
    mask then hides every key from its rows: the kernel's NaN rows make ATen's call run
    again, on the rotary embedding's views of the queries, which the kernel reads in place)."""
    t = pytest.importorskip("transformers")
    torch.manual_seed(0)
    size = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=512,
                max_position_embeddings=64, attn_implementation=implementation)
    if name == "bert":
        model = models.hf.TensorOutput(t.BertModel(t.BertConfig(**size, intermediate_size=128),
                                                   add_pooling_layer=False))
    elif name == "gptj":
        model = _MaskByName(t.GPTJModel(t.GPTJConfig(
            n_layer=2, n_embd=64, n_head=4, rotary_dim=8, vocab_size=512, n_positions=64,
            attn_implementation=implementation)))
    else:
        model = models.hf.TensorOutput(t.LlamaModel(t.LlamaConfig(**size, intermediate_size=128,
                                                                   num_key_value_heads=4)),
                                       use_cache=False)
    ids = torch.randint(0, 512, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.int64)
    mask[1, 10:] = 0
    options = kiln.Options(strict=True, generated_kernels=True, measure_kernels=False)
    compiled = kiln.compile(model.eval(), (ids, mask), options)
    attention = [k for k in compiled.report.kernels
                 if k.kind == "generated" and "kiln_attention" in (k.source or "")]
    assert len(attention) == 2  # (one a layer)
    with torch.no_grad():
        _check(compiled(ids, mask), model(ids, mask), name)
        mask[0, 12:] = 0  # (another padding: the same compiled model)
        _check(compiled(ids, mask), model(ids, mask), name)
        mask[1] = 0  # (a sequence of padding only)
        torch.testing.assert_close(compiled(ids, mask), model(ids, mask), rtol=1e-4,
                                   atol=1e-4, equal_nan=True)


class _PaddedDecodeStep(torch.nn.Module):
    """`models.hf.DecodeStep` with the batch's attention mask over the cached tokens and
    the new one (a left-padded batch generating)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.step = models.hf.DecodeStep(model)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, *kv: torch.Tensor) -> torch.Tensor:
        step = self.step
        cache = step.cache_class()
        for layer in range(len(kv) // 2):
            cache.update(kv[2 * layer], kv[2 * layer + 1], layer)
        positions = torch.arange(kv[0].shape[2], kv[0].shape[2] + ids.shape[1]).unsqueeze(0)
        return step.model(ids, attention_mask=mask, position_ids=positions, use_cache=True,
                          return_dict=False, **{step.cache_argument: cache})[0]


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_a_padded_batch_decode_step_runs_the_decode_attention(implementation: str) -> None:
    """Llama (two key heads for four query heads) generating for a left-padded batch of two
    over 20 cached tokens: the padding mask, computed at run time, is read by the few-queries
    kernel in each layer (sdpa: 8 rows of one query; eager: the query heads stacked on their
    key head, 4 rows of two), and the step matches eager, also for another padding."""
    t = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = t.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                           num_key_value_heads=2, intermediate_size=128, vocab_size=512,
                           max_position_embeddings=64, attn_implementation=implementation)
    model = _PaddedDecodeStep(t.LlamaModel(config)).eval()
    kv = [torch.randn(2, 2, 20, 16) for _ in range(4)]
    ids = torch.randint(0, 512, (2, 1))
    mask = torch.ones(2, 21, dtype=torch.int64)
    mask[1, :6] = 0
    options = kiln.Options(strict=True, generated_kernels=True, measure_kernels=False)
    compiled = kiln.compile(model, (ids, mask, *kv), options)
    decode = "kiln_attention_decode_8x1x21x16" if implementation == "sdpa" \
        else "kiln_attention_decode_4x2x21x16"
    assert sum(decode in (k.source or "") for k in compiled.report.kernels) == 2
    with torch.no_grad():
        _check(compiled(ids, mask, *kv), model(ids, mask, *kv), "hf_llama")
        mask[0, :3] = 0
        _check(compiled(ids, mask, *kv), model(ids, mask, *kv), "hf_llama")


def test_grouped_query_sdpa_runs_the_generated_attention() -> None:
    """Llama with HF's default attention (sdpa) and two key heads for four query heads calls
    torch's fused attention with ``enable_gqa`` (no mask: ``is_causal``); through either
    frontend that call runs as the generated kernel, each query head reading its group's key
    head, and matches eager."""
    t = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = t.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                           num_key_value_heads=2, intermediate_size=128, vocab_size=512,
                           max_position_embeddings=64, attn_implementation="sdpa")
    model = models.hf.TensorOutput(t.LlamaModel(config), use_cache=False).eval()
    ids = torch.randint(0, 512, (1, 24))
    options = {"strict": True, "generated_kernels": True, "measure_kernels": False}
    report = CompileReport()
    torch._dynamo.reset()
    fast = torch.compile(model, backend=functools.partial(kiln_backend, options=options,
                                                          report=report), fullgraph=True)
    compiled = kiln.compile(model, (ids,), kiln.Options(**options))
    for kernels in (compiled.report.kernels, None):
        with torch.no_grad():
            _check((fast if kernels is None else compiled)(ids), model(ids), "hf_llama")
        kernels = kernels if kernels is not None else report.kernels
        assert sum("kiln_attention" in (k.source or "") for k in kernels) == 2
