import math
import statistics

import pytest
import torch

from posttrain.algos.advantages import ADVANTAGES, gae, grpo_advantages

T_, F_ = True, False


def _adv(name, rewards, valid=None):
    r = torch.tensor(rewards, dtype=torch.float32)
    v = torch.ones_like(r, dtype=torch.bool) if valid is None else torch.tensor(valid)
    return ADVANTAGES[name](r, v)


def test_dr_grpo_hand_worked():
    adv, m = _adv("dr_grpo", [[1, 0], [0, 1]])
    torch.testing.assert_close(adv, torch.tensor([[0.5, -0.5], [-0.5, 0.5]]))
    assert m["zero_variance_P"].tolist() == [False, False]
    assert m["zero_variance_frac"].item() == 0.0


def test_grpo_hand_worked_uses_bessel_std():
    adv, _ = _adv("grpo", [[1, 0], [0, 1]])
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    torch.testing.assert_close(adv, torch.tensor([[a, -a], [-a, a]]))


def test_rloo_hand_worked():
    adv, _ = _adv("rloo", [[1, 0, 0]])
    torch.testing.assert_close(adv, torch.tensor([[1.0, -0.5, -0.5]]))


def test_reinforce_pp_hand_worked_whitens_over_tokens():
    # centred [[.5, -.5], [0, 0]] given to 2, 4, 3 and 1 tokens: 10 tokens, mean (1 - 2) / 10 = -0.1,
    # deviations .6 (x2), -.4 (x4), .1 (x4): Bessel variance (.72 + .64 + .04) / 9
    r = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    adv, m = ADVANTAGES["reinforce_pp"](r, torch.ones_like(r, dtype=torch.bool),
                                        lengths_PG=torch.tensor([[2, 4], [3, 1]]))
    s = math.sqrt(1.40 / 9 + 1e-8)
    torch.testing.assert_close(adv, torch.tensor([[0.6 / s, -0.4 / s], [0.0, 0.0]]))
    assert m["zero_variance_P"].tolist() == [False, True]


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_invalid_samples_are_excluded_and_zero(name):
    adv, _ = _adv(name, [[1, 0, 5.0]], [[T_, T_, F_]])
    assert adv[0, 2].item() == 0.0
    # the invalid reward 5 does not move the baseline: the two valid ones are symmetric
    assert adv[0, 0].item() == pytest.approx(-adv[0, 1].item())
    assert adv[0, 0].item() > 0


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_zero_variance_groups_get_exact_zero(name):
    adv, m = _adv(name, [[1, 1, 1], [0.3, 0.3, 7.0], [1, 0, 1], [2, 0, 0]], [[T_] * 3, [T_, T_, F_], [T_, F_, F_], [T_] * 3])
    assert m["zero_variance_P"].tolist() == [True, True, True, False]
    assert m["zero_variance_frac"].item() == 0.75
    assert torch.all(adv[:3] == 0.0)
    assert torch.all(adv[3] != 0.0)


def _slow_reference(name, rewards, valid, lengths, eps=1e-6):
    """Plain-Python statement of each estimator; REINFORCE++ as the paper writes it, over tokens."""
    P, G = len(rewards), len(rewards[0])
    out = [[0.0] * G for _ in range(P)]
    trained = set()  # (p, g) of valid samples in groups with a signal
    tokens = []  # REINFORCE++: every loss token of every valid sample carries its centred reward
    for p in range(P):
        vals = [rewards[p][g] for g in range(G) if valid[p][g]]
        zero_var = len(vals) < 2 or max(vals) == min(vals)
        mean = sum(vals) / len(vals) if vals else 0.0
        tokens += [rewards[p][g] - mean for g in range(G) if valid[p][g] for _ in range(lengths[p][g])]
        for g in range(G):
            if not valid[p][g] or zero_var:
                continue
            r = rewards[p][g]
            trained.add((p, g))
            if name == "grpo":
                out[p][g] = (r - mean) / (statistics.stdev(vals) + eps)
            elif name in ("dr_grpo", "reinforce_pp"):
                out[p][g] = r - mean
            elif name == "rloo":
                out[p][g] = r - (sum(vals) - r) / (len(vals) - 1)
    if name == "reinforce_pp":
        mu, var = statistics.fmean(tokens), statistics.variance(tokens)
        out = [[(a - mu) / math.sqrt(var + 1e-8) if (p, g) in trained else 0.0 for g, a in enumerate(row)]
               for p, row in enumerate(out)]
    return out


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_matches_plain_python_reference(name):
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 3, (20, 6), generator=gen).float() / 2
    valid = torch.rand(20, 6, generator=gen) > 0.2
    lengths = torch.randint(5, 60, (20, 6), generator=gen)
    adv, _ = ADVANTAGES[name](rewards, valid, lengths_PG=lengths)
    ref = _slow_reference(name, rewards.tolist(), valid.tolist(), lengths.tolist())
    torch.testing.assert_close(adv, torch.tensor(ref), rtol=1e-5, atol=1e-6)


def test_grpo_advantages_scale_flag():
    r, v = torch.tensor([[3.0, 1.0]]), torch.ones(1, 2, dtype=torch.bool)
    torch.testing.assert_close(grpo_advantages(r, v, scale_by_std=False)[0], torch.tensor([[1.0, -1.0]]))
    with pytest.raises(ValueError):
        grpo_advantages(r, torch.ones(2, 1, dtype=torch.bool))


def _gae_reference(rewards, values, mask, gamma, lam):
    """Textbook GAE on the valid tokens of each row, terminal value 0 after the last."""
    adv_rows, ret_rows = [], []
    for r_row, v_row, m_row in zip(rewards, values, mask):
        idx = [t for t, m in enumerate(m_row) if m]
        adv_row, ret_row = [0.0] * len(r_row), [0.0] * len(r_row)
        running = 0.0
        for k in reversed(range(len(idx))):
            t = idx[k]
            next_v = v_row[idx[k + 1]] if k + 1 < len(idx) else 0.0
            delta = r_row[t] + gamma * next_v - v_row[t]
            running = delta + gamma * lam * running
            adv_row[t], ret_row[t] = running, running + v_row[t]
        adv_rows.append(adv_row)
        ret_rows.append(ret_row)
    return torch.tensor(adv_rows), torch.tensor(ret_rows)


def test_gae_hand_worked():
    # δ1 = 1 - 0.4 = 0.6; δ0 = 0.9·0.4 - 0.2 = 0.16; A0 = 0.16 + 0.45·0.6 = 0.43
    adv, ret = gae(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.2, 0.4]]), torch.ones(1, 2), 0.9, 0.5)
    torch.testing.assert_close(adv, torch.tensor([[0.43, 0.6]]))
    torch.testing.assert_close(ret, torch.tensor([[0.63, 1.0]]))


def test_gae_gamma_lambda_one_zero_values_is_reward_to_go():
    rewards = torch.tensor([[1.0, 2.0, 3.0, 0.0], [0.5, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    adv, ret = gae(rewards, torch.zeros(2, 4), mask, 1.0, 1.0)
    torch.testing.assert_close(adv, torch.tensor([[6.0, 5.0, 3.0, 0.0], [0.5, 0.0, 0.0, 0.0]]))
    torch.testing.assert_close(ret, adv)


def test_gae_matches_reference_with_interior_masked_tokens():
    gen = torch.Generator().manual_seed(0)
    rewards, values = torch.randn(5, 9, generator=gen), torch.randn(5, 9, generator=gen)
    mask = torch.rand(5, 9, generator=gen) > 0.3
    adv, ret = gae(rewards, values, mask, 0.95, 0.9)
    ref_adv, ref_ret = _gae_reference(rewards.tolist(), values.tolist(), mask.tolist(), 0.95, 0.9)
    torch.testing.assert_close(adv, ref_adv)
    torch.testing.assert_close(ret, ref_ret)
