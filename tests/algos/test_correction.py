import math

import pytest
import torch

from posttrain.algos.correction import IS_CORRECTIONS, geo_mean_seq_ratio, masked_is, mismatch_metrics, truncated_is

# token ratios trainer/sampler = 2, 1, 0.5
TRAINER = torch.tensor([[math.log(0.5), math.log(0.9), math.log(0.3)]])
SAMPLER = torch.tensor([[math.log(0.25), math.log(0.9), math.log(0.6)]])
ALL = torch.ones(1, 3, dtype=torch.bool)
FIRST_TWO = torch.tensor([[True, True, False]])


def test_truncated_token_level_hand_worked():
    w, m = truncated_is(TRAINER, SAMPLER, ALL, cap=1.5)
    torch.testing.assert_close(w, torch.tensor([[1.5, 1.0, 0.5]]))
    assert m["is/truncated_frac"].item() == pytest.approx(1 / 3)
    assert m["is/ratio_mean"].item() == pytest.approx(3.5 / 3)
    assert m["is/ratio_max"].item() == pytest.approx(2.0)


def test_truncated_sequence_and_geometric_levels():
    w, m = truncated_is(TRAINER, SAMPLER, ALL, cap=1.5, level="sequence")
    torch.testing.assert_close(w, torch.ones(1, 3))  # 2 · 1 · 0.5 = 1
    w, m = truncated_is(TRAINER, SAMPLER, FIRST_TWO, cap=1.5, level="sequence")
    torch.testing.assert_close(w, torch.tensor([[1.5, 1.5, 0.0]]))  # product 2, capped
    assert m["is/truncated_frac"].item() == 1.0
    assert m["is/ratio_max"].item() == pytest.approx(2.0)
    w, _ = truncated_is(TRAINER, SAMPLER, FIRST_TWO, cap=1.5, level="geometric")
    torch.testing.assert_close(w, torch.tensor([[math.sqrt(2), math.sqrt(2), 0.0]]))
    torch.testing.assert_close(geo_mean_seq_ratio(TRAINER, SAMPLER, FIRST_TWO), torch.tensor([math.sqrt(2)]))


def test_masked_is_hand_worked():
    w, m = masked_is(TRAINER, SAMPLER, ALL, low=0.6, high=1.5)
    torch.testing.assert_close(w, torch.tensor([[0.0, 1.0, 0.0]]))
    assert m["is/masked_frac"].item() == pytest.approx(2 / 3)
    w, m = masked_is(TRAINER, SAMPLER, FIRST_TWO, low=0.6, high=1.5, level="sequence")
    torch.testing.assert_close(w, torch.zeros(1, 3))
    assert m["is/masked_frac"].item() == 1.0


def test_mismatch_metrics_hand_worked():
    m = mismatch_metrics(TRAINER, SAMPLER, ALL)
    assert m["mismatch/logprob_abs_diff_mean"].item() == pytest.approx(2 * math.log(2) / 3)
    assert m["mismatch/logprob_abs_diff_max"].item() == pytest.approx(math.log(2))
    k3 = (1 - math.log(2)) + 0 + (-0.5 + math.log(2))
    assert m["mismatch/kl"].item() == pytest.approx(k3 / 3)


def test_mismatch_kl_estimates_kl_sampler_to_trainer():
    sampler_p = torch.tensor([0.6, 0.3, 0.1])
    trainer_p = torch.tensor([0.5, 0.3, 0.2])
    x = torch.multinomial(sampler_p, 100_000, replacement=True, generator=torch.Generator().manual_seed(0))
    m = mismatch_metrics(trainer_p.log()[x][None], sampler_p.log()[x][None], torch.ones(1, x.numel()))
    true_kl = (sampler_p * (sampler_p / trainer_p).log()).sum().item()
    assert m["mismatch/kl"].item() == pytest.approx(true_kl, abs=0.003)


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
@pytest.mark.parametrize("name", sorted(IS_CORRECTIONS))
def test_weights_detached_finite_and_zero_at_padding(name, level):
    trainer = torch.full((2, 1000), 0.0, requires_grad=True)
    sampler = torch.full((2, 1000), -1.0)  # sequence log-ratio 1000: must not overflow
    mask = torch.ones(2, 1000, dtype=torch.bool)
    mask[1, 500:] = False
    w, m = IS_CORRECTIONS[name](trainer, sampler, mask, level=level)
    assert not w.requires_grad
    assert torch.all(torch.isfinite(w)) and torch.all(w[~mask] == 0)
    assert all(torch.isfinite(v) for v in m.values())


def test_bad_level_raises():
    with pytest.raises(ValueError, match="level"):
        truncated_is(TRAINER, SAMPLER, ALL, level="seq")
