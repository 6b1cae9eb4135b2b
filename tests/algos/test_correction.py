import math

import pytest
import torch

from posttrain.algos.correction import (IS_CORRECTIONS, LEVELLED, geo_mask, geo_mean_seq_ratio, icepop, k3_mask,
                                        masked_is, mismatch_metrics, rejection_is, truncated_is)

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


def test_rejection_is_hand_worked():
    w, m = rejection_is(TRAINER, SAMPLER, ALL, low=0.6, high=1.5)
    torch.testing.assert_close(w, torch.tensor([[0.0, 1.0, 0.0]]))
    assert m["is/masked_frac"].item() == pytest.approx(2 / 3)
    w, m = rejection_is(TRAINER, SAMPLER, FIRST_TWO, low=0.6, high=1.5, level="sequence")
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
    if name not in LEVELLED and level != "token":
        pytest.skip("the correction fixes its own level")
    trainer = torch.full((2, 1000), 0.0, requires_grad=True)
    sampler = torch.full((2, 1000), -1.0)  # sequence log-ratio 1000: must not overflow
    mask = torch.ones(2, 1000, dtype=torch.bool)
    mask[1, 500:] = False
    w, m = IS_CORRECTIONS[name](trainer, sampler, mask, **({"level": level} if name in LEVELLED else {}))
    assert not w.requires_grad
    assert torch.all(torch.isfinite(w)) and torch.all(w[~mask] == 0)
    assert all(torch.isfinite(v) for v in m.values())


def test_bad_level_raises():
    with pytest.raises(ValueError, match="level"):
        truncated_is(TRAINER, SAMPLER, ALL, level="seq")


# Two sequences: ratios (2, 1, 0.5) and (1.25, 0.8, padding).
TRAINER2 = torch.tensor([[math.log(0.5), math.log(0.9), math.log(0.3)], [math.log(0.5), math.log(0.4), 0.0]])
SAMPLER2 = torch.tensor([[math.log(0.25), math.log(0.9), math.log(0.6)], [math.log(0.4), math.log(0.5), 0.0]])
MASK2 = torch.tensor([[True, True, True], [True, True, False]])


def test_rejection_is_metrics_hand_worked():
    w, m = rejection_is(TRAINER2, SAMPLER2, MASK2, low=0.6, high=1.5)
    torch.testing.assert_close(w, torch.tensor([[0.0, 1.0, 0.0], [1.0, 1.0, 0.0]]))
    assert m["is/masked_token_frac"].item() == pytest.approx(2 / 5)  # ratios 2 and 0.5 of five tokens
    assert m["is/masked_seq_frac"].item() == pytest.approx(1 / 2)  # the first sequence lost tokens
    assert m["is/above_frac"].item() == pytest.approx(1 / 5) and m["is/below_frac"].item() == pytest.approx(1 / 5)


def test_icepop_hand_worked():
    # bounds [0.625, 1.6]; 2 and 0.5 are dropped, 1, 1.25 and 0.8 keep their ratio as weight
    w, m = icepop(TRAINER2, SAMPLER2, MASK2, low=0.625, high=1.6)
    torch.testing.assert_close(w, torch.tensor([[0.0, 1.0, 0.0], [1.25, 0.8, 0.0]]))
    assert m["is/masked_token_frac"].item() == pytest.approx(2 / 5)
    assert m["is/masked_seq_frac"].item() == pytest.approx(1 / 2)
    w, _ = icepop(TRAINER2, SAMPLER2, MASK2, low=0.5, high=5.0)  # the paper's [0.5, 5]: all kept
    torch.testing.assert_close(w, torch.tensor([[2.0, 1.0, 0.5], [1.25, 0.8, 0.0]]))
    w, _ = icepop(TRAINER2, SAMPLER2, MASK2, low=0.9, high=5.0)  # the lower bound is read: 0.5 and 0.8 go
    torch.testing.assert_close(w, torch.tensor([[2.0, 1.0, 0.0], [1.25, 0.0, 0.0]]))


def test_published_mis_float64_hand_worked():
    """MIS (Liu, Li et al. 2025): w = ρ · 1{ρ ≤ C}, worked by hand in float64 with C = 1.5.

    Token ratios 2, 1, 0.5 | 1.25, 0.8: 2 > C is dropped, the others keep their ratio (not 1, as a
    rejection would give). Per sequence: the product 2·1·0.5 = 1 ≤ C keeps weight 1 on every token;
    1.25·0.8 = 1 too; with the first two tokens only, 2·1 = 2 > C drops the sequence."""
    t = torch.tensor([[math.log(0.5), math.log(0.9), math.log(0.3)], [math.log(0.5), math.log(0.4), 0.0]],
                     dtype=torch.float64)
    s = torch.tensor([[math.log(0.25), math.log(0.9), math.log(0.6)], [math.log(0.4), math.log(0.5), 0.0]],
                     dtype=torch.float64)
    m = MASK2
    w, met = masked_is(t, s, m, cap=1.5)
    assert w.dtype == torch.float64
    want = torch.tensor([[0.0, 1.0, 0.5], [1.25, 0.8, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(w, want, rtol=0, atol=1e-15)
    assert met["is/masked_token_frac"].item() == pytest.approx(1 / 5)
    w, _ = masked_is(t, s, m, cap=1.5, level="sequence")
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64),
                               rtol=0, atol=1e-15)
    w, _ = masked_is(t, s, torch.tensor([[True, True, False], [True, True, False]]), cap=1.5, level="sequence")
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]], dtype=torch.float64),
                               rtol=0, atol=1e-15)


def test_geo_mask_hand_worked():
    # geometric means: (2 · 1 · 0.5)^(1/3) = 1; (1.25 · 0.8)^(1/2) = 1; both kept at any bounds around 1
    w, m = geo_mask(TRAINER2, SAMPLER2, MASK2, low=0.99, high=1.01)
    torch.testing.assert_close(w, MASK2.float())
    assert m["is/masked_seq_frac"].item() == 0.0
    # first two tokens only: sqrt(2) = 1.414 > 1.4, dropped; the second sequence is unchanged
    w, m = geo_mask(TRAINER2, SAMPLER2, torch.tensor([[True, True, False], [True, True, False]]), low=0.7, high=1.4)
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]))
    assert m["is/masked_seq_frac"].item() == pytest.approx(1 / 2)
    assert m["is/masked_token_frac"].item() == pytest.approx(2 / 4)


def test_k3_mask_hand_worked():
    k3 = lambda r: r - 1 - math.log(r)  # noqa: E731
    seq0 = (k3(2.0) + k3(1.0) + k3(0.5)) / 3  # (0.3069 + 0 + 0.1931) / 3 = 0.1667
    seq1 = (k3(1.25) + k3(0.8)) / 2  # (0.0269 + 0.0231) / 2 = 0.0250
    assert seq0 == pytest.approx(1 / 6, abs=1e-4) and seq1 == pytest.approx(0.025, abs=1e-4)
    w, m = k3_mask(TRAINER2, SAMPLER2, MASK2, max_kl=0.1)
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]))
    assert m["is/k3_seq_mean"].item() == pytest.approx((seq0 + seq1) / 2, rel=1e-5)
    assert m["is/k3_seq_max"].item() == pytest.approx(seq0, rel=1e-5)
    assert m["is/masked_seq_frac"].item() == pytest.approx(1 / 2)
    assert m["is/masked_token_frac"].item() == pytest.approx(3 / 5)
    w, _ = k3_mask(TRAINER2, SAMPLER2, MASK2, max_kl=0.02)  # both rejected
    assert w.sum().item() == 0.0


def test_mismatch_ratio_outside_2x_hand_worked():
    m = mismatch_metrics(TRAINER2 + torch.tensor([[0.1, 0.0, -0.1], [0.0, 0.0, 5.0]]), SAMPLER2, MASK2)
    # ratios 2·e^0.1 and 0.5·e^-0.1 are outside [1/2, 2]; the padded 5.0 is not counted
    assert m["mismatch/ratio_outside_2x_frac"].item() == pytest.approx(2 / 5)


# ------------------------------------------------------------------ float64 references, written here


def _rows(trainer, sampler, mask):
    """Per sequence, the float64 log-ratios of its valid tokens, and the positions they sit at."""
    t, s, m = trainer.double().tolist(), sampler.double().tolist(), mask.tolist()
    return [([t[b][i] - s[b][i] for i in range(len(m[b])) if m[b][i]], [i for i in range(len(m[b])) if m[b][i]])
            for b in range(len(m))]


def _ref(trainer, sampler, mask, weight_of_row):
    """A (B, T) float64 weight tensor from ``weight_of_row(log_ratios) -> weights of those tokens``."""
    out = torch.zeros(mask.shape, dtype=torch.float64)
    for b, (d, pos) in enumerate(_rows(trainer, sampler, mask)):
        for i, w in zip(pos, weight_of_row(d)):
            out[b, i] = w
    return out


def _k3(d):
    return math.exp(d) - 1 - d


REFERENCES = {
    "truncated/token": (lambda t, s, m: truncated_is(t, s, m, cap=1.3)[0],
                        lambda d: [min(math.exp(x), 1.3) for x in d]),
    "truncated/sequence": (lambda t, s, m: truncated_is(t, s, m, cap=1.3, level="sequence")[0],
                           lambda d: [min(math.exp(sum(d)), 1.3)] * len(d)),
    "rejection/token": (lambda t, s, m: rejection_is(t, s, m, low=0.8, high=1.2)[0],
                        lambda d: [1.0 if 0.8 <= math.exp(x) <= 1.2 else 0.0 for x in d]),
    "rejection/sequence": (lambda t, s, m: rejection_is(t, s, m, low=0.6, high=1.6, level="sequence")[0],
                           lambda d: [1.0 if 0.6 <= math.exp(sum(d)) <= 1.6 else 0.0] * len(d)),
    "mis/token": (lambda t, s, m: masked_is(t, s, m, cap=1.2)[0],
                  lambda d: [math.exp(x) if math.exp(x) <= 1.2 else 0.0 for x in d]),
    "mis/sequence": (lambda t, s, m: masked_is(t, s, m, cap=1.6, level="sequence")[0],
                     lambda d: [math.exp(sum(d)) if math.exp(sum(d)) <= 1.6 else 0.0] * len(d)),
    "icepop": (lambda t, s, m: icepop(t, s, m, low=0.9, high=1.2)[0],
               lambda d: [math.exp(x) if 0.9 <= math.exp(x) <= 1.2 else 0.0 for x in d]),
    "geo_mask": (lambda t, s, m: geo_mask(t, s, m, low=0.97, high=1.03)[0],
                 lambda d: [1.0 if 0.97 <= math.exp(sum(d) / len(d)) <= 1.03 else 0.0] * len(d)),
    "k3_mask": (lambda t, s, m: k3_mask(t, s, m, max_kl=0.008)[0],
                lambda d: [1.0 if sum(_k3(x) for x in d) / len(d) <= 0.008 else 0.0] * len(d)),
}


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_correction_equals_float64_reference(name):
    g = torch.Generator().manual_seed(7)
    B, T = 64, 12
    sampler = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    # a spread of mismatch sizes: some rows near-identical, some far apart
    scale = torch.logspace(-3, -0.5, B, dtype=torch.float64)[:, None]
    trainer = sampler + torch.randn(B, T, generator=g, dtype=torch.float64) * scale
    mask = torch.arange(T)[None] < torch.randint(1, T + 1, (B, 1), generator=g)
    fast, reference = REFERENCES[name]
    got = fast(trainer, sampler, mask)
    want = _ref(trainer, sampler, mask, reference)
    bound = (want == 1.3) if name.startswith("truncated") else (want == 0)
    assert 0 < int((bound & mask).sum()) < int(mask.sum())  # the bound binds on some tokens, not all
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
