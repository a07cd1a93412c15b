"""Correctness and slowdown sweep of Hugging Face ``transformers`` architectures through kiln.

    python benchmarks/hf_sweep.py [--only bert,llama] [--attn sdpa,eager] [--limit 120]
                                  [--timeout 240] [--out /tmp/hf_sweep.jsonl]
                                  [--cache-dir /tmp/kiln-hf-sweep]
    python benchmarks/hf_sweep.py --list

Every architecture of transformers' own registry (``MODEL_MAPPING_NAMES``, the AutoModel
classes) is built from its config class with a small config (2 layers, hidden 64, 4 heads,
2 key/value heads, a 512-token vocabulary, 64x64 images), random weights and non-trivial
biases and norm affines (`kiln.models.hf._randomize_`); nothing is downloaded. Each
(architecture, attention implementation) runs in a subprocess of its own, under a timeout, so
a crash or a hang costs one row: the eager output, then ``kiln.compile`` and
``torch.compile(backend="kiln")`` against it, then eager and kiln.compile's function timed in
interleaved calls. One JSON line per (architecture, attention, path) goes to ``--out``, and a
summary table (counts per status, every row that is not OK) ends the run.

Statuses: MISMATCH (kiln's own rule, `kiln.frontend.agreement`: an error above 1e-3 of the
output's largest magnitude plus 1e-5, a shape or dtype that differs, NaN or infinities
elsewhere than eager's, unequal integers), UPSTREAM (torch.compile's mismatch,
where ``torch.compile(backend="eager")`` mismatches too: Dynamo's capture, not kiln), ERROR
(the exception and the last lines of its traceback), TIMEOUT, FALLBACK (correct, but kiln ran
a piece or the whole graph some other way: its report's fallbacks, among them kiln.compile's
model run eagerly where the compiled model disagreed with it), SLOW (kiln.compile's function
over 1.5x eager's time; on a machine running anything else beside the sweep, small models'
OpenMP regions wait for a time slice each and show here), SKIP (cannot be built or run
eagerly from a config alone), OK.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import enum
import inspect
import json
import logging
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

SEQ = 24  # token ids per text input
DECODER_SEQ = 12  # decoder ids: a length other than the encoder's, so cross attention is not square
IMAGE = 64
AUDIO_SAMPLES = 16000  # one second at the 16 kHz that the speech feature extractors default to
SPECIAL_IDS = 16  # token ids drawn from [SPECIAL_IDS, vocab - SPECIAL_IDS): never a special one
SLOW_RATIO = 1.5
TIMED_CALLS = 5
PATHS = ("kiln.compile", "torch.compile")


class Status(enum.Enum):
    # in order of severity: a row's status is the worst that applies
    MISMATCH = "MISMATCH"
    # torch.compile's answer differs from eager's, and torch.compile(backend="eager") gives
    # the same answer: Dynamo's capture differs from the model, not kiln's graph
    UPSTREAM = "UPSTREAM"
    ERROR = "ERROR"
    TIMEOUT = "TIMEOUT"
    FALLBACK = "FALLBACK"
    SLOW = "SLOW"
    SKIP = "SKIP"
    OK = "OK"


class Skip(Exception):
    """The architecture cannot be built or run eagerly from a small config here: not kiln's
    business, so the row is SKIP with this reason."""


# --- small configs ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Shrink:
    """Integer config attributes set to ``value`` wherever a config (or sub-config) has them."""

    name: str
    keys: tuple[str, ...]
    value: int


SHRINKS = (
    Shrink("layers", ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers",
                      "decoder_layers", "num_encoder_layers", "num_decoder_layers", "depth",
                      "max_window_layers"), 2),  # two layers: each layer kind's code, twice
    Shrink("dense-layers", ("first_k_dense_replace",), 1),  # one dense layer, one MoE layer
    Shrink("width", ("hidden_size", "d_model", "n_embd", "out_hidden_size",
                     "encoder_hidden_size", "decoder_hidden_size", "text_hidden_size"), 64),
    Shrink("heads", ("num_attention_heads", "n_head", "n_heads", "num_heads",
                     "encoder_attention_heads", "decoder_attention_heads",
                     "decoder_num_attention_heads"), 4),
    Shrink("kv-heads", ("num_key_value_heads",), 2),  # grouped-query attention where it exists
    Shrink("head-dim", ("head_dim", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"), 16),
    Shrink("rotary-dim", ("rotary_dim",), 8),  # GPT-J, CodeGen: a part of the 16-wide head
    Shrink("lora-rank", ("kv_lora_rank", "q_lora_rank"), 32),
    Shrink("ffn", ("intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff",
                   "n_inner", "decoder_intermediate_size", "mlp_dim"), 256),  # 4x width
    Shrink("moe-ffn", ("moe_intermediate_size", "shared_expert_intermediate_size"), 128),
    Shrink("experts", ("num_experts", "n_routed_experts", "num_local_experts"), 4),
    Shrink("experts-per-token", ("num_experts_per_tok",), 2),
    Shrink("expert-groups", ("n_group", "num_group", "num_expert_group", "topk_group",
                             "n_shared_experts"), 1),
    Shrink("vocab", ("vocab_size",), 512),
    Shrink("positions", ("max_position_embeddings", "n_positions", "max_target_positions"), 128),
    Shrink("source-positions", ("max_source_positions",), 64),  # Whisper: 128 mel frames
    Shrink("image", ("image_size",), IMAGE),
)
# one-off settings a config validates against its depth: what 2 layers need
PER_ARCHITECTURE = {"gpt_neo": {"attention_types": [[["global", "local"], 1]]}}
PER_LAYER_LISTS = ("depths",)  # stage depths of hierarchical vision models: one block a stage
LAYER_KEYS = SHRINKS[0].keys


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shrunk_ints(config: dict[str, Any]) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    for shrink in SHRINKS:
        for key in shrink.keys:
            value = config.get(key)
            if _is_int(value) and value > shrink.value:
                changes[key] = shrink.value
            elif key == "image_size" and isinstance(value, list) and len(value) == 2:
                changes[key] = [IMAGE, IMAGE]
    if "kv_lora_rank" in config and "num_key_value_heads" in changes:
        changes["num_key_value_heads"] = changes.get("num_attention_heads", 4)  # MLA: no GQA
    patch = config.get("patch_size")
    if _is_int(patch) and patch >= 14 and "image_size" in config:  # ViT's 16 or 14: 8x8 patches
        changes["patch_size"] = 8
    for key in PER_LAYER_LISTS:
        if isinstance(config.get(key), list):
            changes[key] = [1] * len(config[key])
    if isinstance(config.get("depths"), list) and _is_int(config.get("window_size")):
        # Swin's windows: 2x2 fit every stage of a 64x64 image (16x16 patches down to 2x2);
        # a window larger than a stage's map is clamped, and its position bias then mismatches
        changes["window_size"] = 2
    return changes


def _special_ids(config: dict[str, Any], vocab: int) -> dict[str, Any]:
    """Token ids (pad, eos, image tokens...) from ``SPECIAL_IDS`` up moved into the top
    ``SPECIAL_IDS`` of the small vocabulary; equal ids stay equal. The smaller ones stay (a pad
    id is the padding index of RoBERTa's position embeddings too). The random input ids are
    drawn between the two ranges, and never hit one."""
    keys = [k for k in config if k.endswith(("_token_id", "_token_index"))]
    olds = sorted({v for k in keys for v in _as_list(config[k])
                   if _is_int(v) and v >= SPECIAL_IDS})
    new = {old: vocab - 1 - i % SPECIAL_IDS for i, old in enumerate(olds)}
    changes = {}
    for key in keys:
        value = config[key]
        if isinstance(value, list):
            changes[key] = [new.get(v, v) for v in value]
        elif value in new:
            changes[key] = new[value]
    return changes


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _shrink(config: dict[str, Any], vocab: int, whole: bool) -> dict[str, Any]:
    """The changes to a config's dict (``whole``: the dict itself, changed, for a sub-config
    that is passed whole); sub-configs (dicts with a ``model_type``) recursively."""
    changes = _shrunk_ints(config)
    changes.update(_special_ids(config, vocab))
    for key, value in config.items():
        if isinstance(value, dict) and "model_type" in value:
            changes[key] = _shrink(value, vocab, whole=True)
    if not whole:
        return changes
    layers = {config[k] for k in LAYER_KEYS if _is_int(config.get(k))}
    # per-layer lists (layer_types...) that __init__ derives from the old depth: let it again
    kept = {k: v for k, v in config.items()
            if not (isinstance(v, list) and len(v) in layers and k not in changes)}
    return {**kept, **changes}


def small_config(model_type: str) -> Any:
    from transformers import AutoConfig

    default = AutoConfig.for_model(model_type)
    vocab = min(getattr(default, "vocab_size", 512) or 512, 512)
    changes = _shrink(default.to_dict(), vocab, whole=False)
    changes.update(PER_ARCHITECTURE.get(model_type, {}))
    try:
        return AutoConfig.for_model(model_type, **changes)
    except Exception as err:  # noqa: BLE001 - any validation error of the config class
        cause = err.__cause__ or err  # a strict dataclass's validator: the cause says what
        raise Skip(f"config: {type(cause).__name__}: {_first_line(cause)}") from err


# --- inputs -------------------------------------------------------------------------------------

def _vocab(config: Any) -> int:
    for holder in (config, getattr(config, "text_config", None)):
        if _is_int(getattr(holder, "vocab_size", None)):
            return holder.vocab_size
    return 512


def _ids(config: Any, length: int) -> torch.Tensor:
    vocab = _vocab(config)
    return torch.randint(SPECIAL_IDS, max(vocab - SPECIAL_IDS, SPECIAL_IDS + 1), (1, length))


def _image(config: Any) -> torch.Tensor:
    holder = getattr(config, "vision_config", None) or config
    channels = getattr(holder, "num_channels", None) or getattr(holder, "in_channels", 3)
    size = getattr(holder, "image_size", IMAGE)
    height, width = size if isinstance(size, (list, tuple)) else (size, size)
    return torch.randn(1, channels, height, width)


def _features(config: Any) -> torch.Tensor:
    holder = getattr(config, "audio_config", None) or getattr(config, "encoder_config",
                                                              None) or config
    if _is_int(getattr(holder, "num_mel_bins", None)):  # Whisper's (mel bins, frames)
        frames = 2 * getattr(holder, "max_source_positions", 64)
        return torch.randn(1, holder.num_mel_bins, frames)
    if _is_int(getattr(holder, "input_feat_per_channel", None)):  # Speech2Text's (frames, mel)
        return torch.randn(1, 128, holder.input_feat_per_channel * holder.input_channels)
    if _is_int(getattr(holder, "feature_size", None)):
        return torch.randn(1, 128, holder.feature_size)
    raise Skip("input: no known layout for input_features")


def _bbox(config: Any) -> torch.Tensor:
    corners = torch.randint(0, 500, (1, SEQ, 2))  # LayoutLM's boxes: x0 <= x1, y0 <= y1
    return torch.cat([corners, corners + torch.randint(0, 500, (1, SEQ, 2))], dim=-1)


# forward argument -> how to make it from the config: text, vision, audio and layout inputs
INPUTS: dict[str, Callable[[Any], torch.Tensor]] = {
    "input_ids": lambda c: _ids(c, SEQ),
    "attention_mask": lambda c: torch.ones(1, SEQ, dtype=torch.int64),
    "decoder_input_ids": lambda c: _ids(c, DECODER_SEQ),
    "pixel_values": _image,
    "input_values": lambda c: torch.randn(1, AUDIO_SAMPLES),
    "input_features": _features,
    "bbox": _bbox,
}
MODALITIES = ("pixel_values", "input_features", "input_values")  # extra inputs on a 2nd try


def _input_plans(model: nn.Module) -> Iterator[list[str]]:
    """Argument lists to try: the main input, the required ones, the attention mask and the
    decoder's ids; then the same with every other modality the forward takes (CLIP-like models
    need both)."""
    params = inspect.signature(model.forward).parameters
    required = [n for n, p in params.items() if p.default is inspect.Parameter.empty
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    main = getattr(model, "main_input_name", "input_ids")
    # a name, or (OneFormer) a list of them
    mains = [main] if isinstance(main, str) else list(main)
    names = [*mains, *required]
    if main == "input_ids":
        names += [n for n in ("attention_mask", "bbox") if n in params]
    names += [n for n in ("decoder_input_ids",) if n in params]
    names = list(dict.fromkeys(names))
    yield names
    extra = [n for n in MODALITIES if n in params and n not in names]
    if extra:
        yield names + extra


class FirstTensor(nn.Module):
    """Calls an HF model with keyword inputs given as positional tensors (``kiln.compile``
    takes tensors) and returns one tensor: ``last_hidden_state``, ``logits``, or the first."""

    def __init__(self, model: nn.Module, names: list[str]) -> None:
        super().__init__()
        self.model = model
        self.names = names
        params = inspect.signature(model.forward).parameters
        # no KV-cache object among the outputs
        self.extra = {"use_cache": False} if "use_cache" in params else {}

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        out = self.model(**dict(zip(self.names, inputs)), **self.extra)
        return _first_tensor(out)


def _first_tensor(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):  # a ModelOutput
        for key in ("last_hidden_state", "logits"):
            if isinstance(out.get(key), torch.Tensor):
                return out[key]
        out = list(out.values())
    if isinstance(out, (tuple, list)):
        for item in out:
            with contextlib.suppress(Skip):
                return _first_tensor(item)
    raise Skip("output: no tensor among the outputs")


# --- building ---------------------------------------------------------------------------------

def build(model_type: str, attn: str) -> tuple[nn.Module, tuple[torch.Tensor, ...], dict]:
    """The model wrapped as ``FirstTensor``, its inputs, and facts for the JSON line."""
    from transformers import AutoModel

    from kiln.models.hf import _randomize_

    config = small_config(model_type)
    torch.manual_seed(0)
    try:
        model = AutoModel.from_config(config, attn_implementation=attn).eval()
    except (ImportError, ModuleNotFoundError) as err:
        raise Skip(f"needs a package: {_first_line(err)}") from err
    except ValueError as err:
        if "does not support" in str(err):
            raise Skip(f"no {attn} attention in this architecture") from err
        raise Skip(f"build: ValueError: {_first_line(err)}") from err
    except Exception as err:  # noqa: BLE001 - whatever the modeling code raises
        raise Skip(f"build: {type(err).__name__}: {_first_line(err)}") from err
    _randomize_(model)
    wrapped, inputs = _runnable(model, config)
    _calibrate(wrapped, inputs)
    facts = {"class": type(model).__name__,
             "attn_used": getattr(model.config, "_attn_implementation", None),
             "params": sum(p.numel() for p in model.parameters()),
             "inputs": {n: list(t.shape) for n, t in zip(wrapped.names, inputs)}}
    return wrapped, inputs, facts


def _runnable(model: nn.Module, config: Any) -> tuple[FirstTensor, tuple[torch.Tensor, ...]]:
    """The first input plan that the model runs eagerly."""
    error: Exception | None = None
    for names in _input_plans(model):
        unknown = [n for n in names if n not in INPUTS]
        if unknown:
            raise Skip(f"input: no recipe for required argument(s) {', '.join(unknown)}")
        torch.manual_seed(1)
        inputs = tuple(INPUTS[n](config) for n in names)
        wrapped = FirstTensor(model, names)
        try:
            with torch.no_grad():
                wrapped(*inputs)
            return wrapped, inputs
        except Skip:
            raise
        except Exception as err:  # noqa: BLE001 - the model's own failure, not kiln's
            error = err
    raise Skip(f"eager forward: {type(error).__name__}: {_first_line(error)}") from error


def _calibrate(model: FirstTensor, inputs: tuple[torch.Tensor, ...]) -> None:
    """Batch-norm statistics from a batch of 4 images, as kiln.models.hf does (HF leaves
    mean 0 / var 1, which hides folding mistakes); a model that cannot train keeps them."""
    from kiln.models._common import calibrate_batchnorm_

    has_bn = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    if not has_bn or model.names != ["pixel_values"]:
        return
    try:
        with torch.no_grad():
            calibrate_batchnorm_(model, inputs[0].expand(4, -1, -1, -1) + torch.randn(4, 1, 1, 1))
    except Exception:  # noqa: BLE001 - train mode of some models differs; keep HF's defaults
        model.eval()


# --- comparing and timing -----------------------------------------------------------------------

def compare(got: Any, expected: torch.Tensor) -> dict[str, Any]:
    """Error figures of ``got`` against eager's output, and the status they earn: MISMATCH
    where kiln's own comparison with a model (`kiln.frontend.agreement.disagreement`) says
    they disagree, with its reason."""
    from kiln.frontend.agreement import disagreement

    why = disagreement(expected, got)
    row: dict[str, Any] = {"status": Status.OK if why is None else Status.MISMATCH}
    if why is not None:
        row["why"] = why
    if isinstance(got, torch.Tensor) and got.shape == expected.shape \
            and expected.is_floating_point() and got.is_floating_point():
        finite = expected.isfinite() & got.isfinite()
        diff = (got.double() - expected.double()).abs()[finite]
        abs_err = float(diff.max()) if diff.numel() else 0.0
        scale = float(expected.double().abs()[finite].max()) if diff.numel() else 0.0
        row.update(abs_err=abs_err, rel_err=abs_err / scale if scale > 0 else
                   (0.0 if abs_err == 0 else math.inf),
                   new_nan=bool((got.isnan() & ~expected.isnan()).any()))
    return row


def time_ratio(eager: Callable[[], Any], kiln_fn: Callable[[], Any]) -> dict[str, float]:
    """Median seconds per call of each, one untimed call first, calls interleaved so a burst
    of load hits both alike."""
    samples: dict[str, list[float]] = {"eager": [], "kiln": []}
    fns = {"eager": eager, "kiln": kiln_fn}
    with torch.no_grad():
        for fn in fns.values():
            fn()
        for _ in range(TIMED_CALLS):
            for name, fn in fns.items():
                start = time.perf_counter()
                fn()
                samples[name].append(time.perf_counter() - start)
    eager_s, kiln_s = (statistics.median(samples[n]) for n in ("eager", "kiln"))
    return {"eager_ms": eager_s * 1e3, "kiln_ms": kiln_s * 1e3, "ratio": kiln_s / eager_s}


# --- the worker: one (architecture, attention) in its own process ----------------------------

class _Captured(logging.Handler):
    """kiln's log warnings: torch.compile's backend reports pieces it runs eagerly only there."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage()[:300])


def _error(err: BaseException) -> dict[str, Any]:
    lines = traceback.format_exception(type(err), err, err.__traceback__)
    tail = "".join(lines).strip().splitlines()[-8:]
    return {"status": Status.ERROR, "error": f"{type(err).__name__}: {_first_line(err)}",
            "traceback": tail}


def _first_line(err: BaseException | None) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:300] if text else ""


def run_kiln_compile(model: nn.Module, inputs: tuple, reference: torch.Tensor
                     ) -> dict[str, Any]:
    import kiln

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = kiln.compile(model, inputs)
        with torch.no_grad():
            row = compare(compiled(*inputs), reference)
    report = compiled.report
    kernels = report.kernels
    row.update(graphs=len(report.graphs), fallbacks=list(report.fallbacks),
               generated_kernels=sum(k.kind == "generated" for k in kernels),
               library_kernels=sum(k.kind != "generated" for k in kernels),
               opaque_ops=sorted({op for g in report.graphs for op in g.opaque_ops}),
               kernel_fallbacks=sum(sum(g.details.fallbacks.values()) for g in report.graphs
                                    if g.details is not None),
               warnings=sorted({w.category.__name__ for w in caught}),
               compile_s=report.compile_seconds)
    if row["status"] is Status.OK and report.fallbacks:
        row["status"] = Status.FALLBACK
    if row["status"] in (Status.OK, Status.FALLBACK):
        row.update(time_ratio(lambda: model(*inputs), lambda: compiled(*inputs)))
        if row["status"] is Status.OK and row["ratio"] > SLOW_RATIO:
            row["status"] = Status.SLOW
    return row


def run_torch_compile(model: nn.Module, inputs: tuple, reference: torch.Tensor
                      ) -> dict[str, Any]:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    captured = _Captured()
    logging.getLogger("kiln").addHandler(captured)
    try:
        compiled = torch.compile(model, backend="kiln")
        with torch.no_grad():
            row = compare(compiled(*inputs), reference)
    finally:
        logging.getLogger("kiln").removeHandler(captured)
    if row["status"] is Status.MISMATCH:
        row["dynamo_eager"] = _dynamo_eager_status(model, inputs, reference)
        if row["dynamo_eager"] == Status.MISMATCH.value:
            row["status"] = Status.UPSTREAM
    eager_pieces = [m for m in captured.messages if "eagerly" in m]
    row.update(graphs=counters["stats"]["unique_graphs"],
               graph_breaks=sum(counters["graph_break"].values()), fallbacks=eager_pieces)
    if row["status"] is Status.OK and eager_pieces:
        row["status"] = Status.FALLBACK
    return row


def _dynamo_eager_status(model: nn.Module, inputs: tuple, reference: torch.Tensor) -> str:
    """Whether Dynamo's capture run by torch (``backend="eager"``) matches eager."""
    torch._dynamo.reset()
    with torch.no_grad():
        return compare(torch.compile(model, backend="eager")(*inputs), reference)["status"].value


def worker(model_type: str, attn: str, out: Path) -> None:
    """Writes a JSON line per stage as it ends, so a timeout still leaves the stages done."""
    import transformers

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(2)
    warnings.filterwarnings("ignore")

    def emit(path: str, row: dict[str, Any]) -> None:
        with out.open("a") as f:
            f.write(json.dumps({"path": path, **row}, default=_json) + "\n")

    try:
        model, inputs, facts = build(model_type, attn)
        with torch.no_grad():
            reference = model(*inputs)
            again = model(*inputs)
        if not torch.equal(reference.nan_to_num(), again.nan_to_num()):
            raise Skip("eager forward: two eager calls differ (random in the forward)")
    except Skip as skip:
        emit("build", {"status": Status.SKIP, "why": str(skip)})
        return
    emit("build", {"status": Status.OK, **facts, "output": list(reference.shape)})
    for path, run in zip(PATHS, (run_kiln_compile, run_torch_compile)):
        emit(path, {"status": Status.ERROR, "error": "started", "stage": "running"})
        try:
            row = run(model, inputs, reference)
        except Exception as err:  # noqa: BLE001 - anything kiln raises is this row's finding
            row = _error(err)
        emit(path, row)


def _json(value: Any) -> Any:
    return value.value if isinstance(value, Status) else str(value)


# --- the driver ---------------------------------------------------------------------------------

def architectures() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    return sorted(MODEL_MAPPING_NAMES)


def run_one(model_type: str, attn: str, timeout: float, cache_dir: str) -> list[dict[str, Any]]:
    """The rows of one (architecture, attention), from a worker subprocess."""
    with tempfile.NamedTemporaryFile("r", suffix=".jsonl", delete=False) as handle:
        out = Path(handle.name)
    env = {**os.environ, "KILN_CACHE_DIR": cache_dir, "OMP_NUM_THREADS": "2"}
    command = [sys.executable, __file__, "--worker", model_type, "--attn", attn,
               "--worker-out", str(out)]
    start = time.perf_counter()
    # a session of its own: a timeout kills the C compilers kiln started too
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True, text=True)
    try:
        _, stderr = proc.communicate(timeout=timeout)
        ended = Status.ERROR
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate()
        ended = Status.TIMEOUT
    seconds = time.perf_counter() - start
    stages: dict[str, dict[str, Any]] = {}
    for line in out.read_text().splitlines():
        row = json.loads(line)
        stages[row["path"]] = row  # a stage's last line wins over its "started" line
    out.unlink()
    rows = _finish(stages, ended, proc.returncode, stderr)
    return [{"arch": model_type, "attn": attn, **row, "seconds": round(seconds, 1)}
            for row in rows]


def _finish(stages: dict[str, dict[str, Any]], ended: Status, returncode: int | None,
            stderr: str) -> list[dict[str, Any]]:
    """The stages' rows, with a TIMEOUT or a crash put on the stage that was running."""
    build_row = stages.get("build")
    if build_row is None or build_row["status"] == Status.SKIP.value:
        if build_row is not None:
            return [build_row]
        why = "while building" if ended is Status.TIMEOUT else f"exit {returncode} building"
        return [{"path": "build", "status": ended.value, "why": why,
                 "stderr": stderr.strip().splitlines()[-5:]}]
    facts = {k: build_row[k] for k in ("class", "attn_used", "params") if k in build_row}
    rows = []
    for path in PATHS:
        row = stages.get(path)
        if row is None or row.get("stage") == "running":
            row = {"path": path, "status": ended.value}
            if stages.get(path) is None:
                row["why"] = "not reached: the worker ended in an earlier stage"
            if ended is Status.ERROR:
                row["error"] = f"worker died (exit {returncode})"
                row["traceback"] = stderr.strip().splitlines()[-8:]
        rows.append({**facts, **row})
    return rows


def summarize(rows: list[dict[str, Any]], wall_s: float) -> str:
    counts = Counter(r["status"] for r in rows)
    lines = [f"{len(rows)} rows in {wall_s / 60:.1f} min: "
             + ", ".join(f"{s.value} {counts[s.value]}" for s in Status if counts[s.value])]
    order = {s.value: i for i, s in enumerate(Status)}
    for r in sorted(rows, key=lambda r: (order[r["status"]], r["arch"], r["attn"])):
        if r["status"] in (Status.OK.value, Status.SKIP.value):
            continue
        lines.append(f"{r['status']:<9} {r['arch']:<28} {r['attn']:<6} {r['path']:<14} "
                     f"{_figures(r)}")
    skips = Counter(_reason_group(r["why"]) for r in rows if r["status"] == Status.SKIP.value)
    lines += [f"SKIP x{n:<3} {why}" for why, n in skips.most_common()]
    return "\n".join(lines)


def _figures(row: dict[str, Any]) -> str:
    if "error" in row:
        return row["error"][:120]
    parts = [f"{k}={row[k]:.3g}" for k in ("rel_err", "abs_err", "ratio") if k in row]
    parts += [f"why={row['why']}"] if "why" in row else []
    parts += [f"fallback={row['fallbacks'][0][:100]}"] if row.get("fallbacks") else []
    return " ".join(parts)


def _reason_group(why: str) -> str:
    return why[:110]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="architectures, comma-separated (model types)")
    parser.add_argument("--list", action="store_true", help="print the architectures and stop")
    parser.add_argument("--attn", default="sdpa,eager", help="attention implementations")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per subprocess")
    parser.add_argument("--out", default="/tmp/hf_sweep.jsonl", help="JSON lines, one a row")
    parser.add_argument("--cache-dir", default="/tmp/kiln-hf-sweep", help="KILN_CACHE_DIR")
    parser.add_argument("--limit", type=int, help="stop after this many architectures that "
                                                  "build (alphabetically)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.attn, Path(args.worker_out))
        return 0
    names = architectures()
    if args.list:
        print("\n".join(names))
        return 0
    if args.only:
        wanted = args.only.split(",")
        unknown = sorted(set(wanted) - set(names))
        if unknown:
            parser.error(f"unknown architectures: {', '.join(unknown)} (see --list)")
        names = wanted
    sweep(names, args)
    return 0


def sweep(names: list[str], args: argparse.Namespace) -> None:
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    built = 0
    Path(args.out).write_text("")
    for name in names:
        if args.limit is not None and built >= args.limit:
            break
        arch_rows = [row for attn in args.attn.split(",")
                     for row in run_one(name, attn, args.timeout, args.cache_dir)]
        built += any(r["status"] != Status.SKIP.value for r in arch_rows)
        with open(args.out, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in arch_rows)
        rows += arch_rows
        shown = ", ".join(f"{r['attn']}/{r['path']} {r['status']}" for r in arch_rows)
        print(f"[{time.perf_counter() - start:6.0f}s] {name}: {shown}", flush=True)
    print(summarize(rows, time.perf_counter() - start))


if __name__ == "__main__":
    sys.exit(main())
