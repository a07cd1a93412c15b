"""benchmarks/hf_sweep.py's choice of inputs, without building any transformers model."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch
from torch import nn

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "hf_sweep.py"


def _sweep():
    spec = importlib.util.spec_from_file_location("hf_sweep_under_test", _PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class _TwoMainInputs(nn.Module):
    """Like OneFormer: main_input_name is a list of names, not one name."""

    main_input_name = ["pixel_values", "task_inputs"]

    def forward(self, pixel_values: torch.Tensor, task_inputs: torch.Tensor,
                mask_labels: torch.Tensor | None = None) -> torch.Tensor:
        return pixel_values


class _TextModel(nn.Module):
    main_input_name = "input_ids"

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                pixel_values: torch.Tensor | None = None) -> torch.Tensor:
        return input_ids


def test_a_list_of_main_inputs_gives_each_name_once() -> None:
    plans = list(_sweep()._input_plans(_TwoMainInputs()))
    assert plans == [["pixel_values", "task_inputs"]]


def test_a_text_model_adds_its_mask_then_the_other_modality() -> None:
    plans = list(_sweep()._input_plans(_TextModel()))
    assert plans == [["input_ids", "attention_mask"],
                     ["input_ids", "attention_mask", "pixel_values"]]
