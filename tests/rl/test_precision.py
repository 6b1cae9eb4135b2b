"""Sampler precision and the sampler/trainer corrections as a run selects them: each named
correction by config, bf16 and fp16 engines against a float32 trainer, and the precision fallback."""

import math
import types

import pytest
import torch

from posttrain.algos import IS_CORRECTIONS
from posttrain.config import ConfigValueError
from posttrain.rl.config import CORRECTION_KINDS, CorrectionConfig
from posttrain.rl.losses import importance_weights

# ratios trainer/sampler per token: (2, 1, 0.5) and (1.25, 0.8, padding)
_OLD = torch.tensor([[math.log(0.5), math.log(0.9), math.log(0.3)], [math.log(0.5), math.log(0.4), 0.0]])
_SAMPLER = torch.tensor([[math.log(0.25), math.log(0.9), math.log(0.6)], [math.log(0.4), math.log(0.5), 0.0]])
_MASK = torch.tensor([[True, True, True], [True, True, False]])
_BATCH = types.SimpleNamespace(old_logp_BT=_OLD, behaviour_logp_BT=_SAMPLER, sampler_logp_BT=_SAMPLER,
                               scored_mask_BT=_MASK)


@pytest.mark.parametrize("kind,knobs,expected", [
    ("truncated", {"cap": 1.5}, [[1.5, 1.0, 0.5], [1.25, 0.8, 0.0]]),
    ("truncated", {"cap": 1.5, "level": "sequence"}, [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]),
    ("masked", {"low": 0.6, "high": 1.5}, [[0.0, 1.0, 0.0], [1.0, 1.0, 0.0]]),
    ("icepop", {"beta": 1.6}, [[0.0, 1.0, 0.0], [1.25, 0.8, 0.0]]),
    ("geo_mask", {"geo_low": 0.99, "geo_high": 1.01}, [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]),
    ("k3_mask", {"k3_max": 0.1}, [[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]),
])
def test_each_named_correction_is_selected_by_config(kind, knobs, expected):
    w, metrics = importance_weights(_BATCH, CorrectionConfig(kind=kind, **knobs))
    torch.testing.assert_close(w, torch.tensor(expected))
    assert "mismatch/kl" in metrics and all(isinstance(v, float) for v in metrics.values())
    if kind not in ("truncated",):
        assert "is/masked_token_frac" in metrics and "is/masked_seq_frac" in metrics


def test_every_config_kind_names_a_correction():
    assert set(CORRECTION_KINDS) - {"auto"} == set(IS_CORRECTIONS)


def test_unknown_correction_is_refused_in_one_line():
    with pytest.raises(ConfigValueError, match="must be one of") as e:
        CorrectionConfig(kind="tis")
    assert e.value.key == "kind" and "\n" not in str(e.value) and "icepop" in str(e.value)


@pytest.mark.parametrize("kind,knob", [("truncated", {"beta": 3.0}), ("icepop", {"k3_max": 0.1}),
                                       ("masked", {"geo_high": 1.1}), ("geo_mask", {"level": "sequence"}),
                                       ("k3_mask", {"level": "sequence"})])
def test_a_knob_of_another_correction_is_refused(kind, knob):
    with pytest.raises(ConfigValueError, match=f"no effect with kind={kind}") as e:
        CorrectionConfig(kind=kind, **knob)
    assert e.value.key == next(iter(knob))
