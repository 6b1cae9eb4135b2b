"""The async start-up self-test's perturbed weights keep a tied lm_head tied to its embedding."""

import torch

from posttrain.rl.async_.selftest import perturbed


def test_perturbed_weights_keep_equal_tensors_equal_and_move_the_rest():
    embed = torch.randn(10, 4)
    weights = {"model.embed_tokens.weight": embed, "layer.weight": torch.randn(10, 4), "lm_head.weight": embed.clone()}
    out = perturbed(weights)
    assert torch.equal(out["lm_head.weight"], out["model.embed_tokens.weight"])  # an engine tying them holds both
    assert all(not torch.equal(out[k], weights[k]) for k in weights)
    assert not torch.equal(out["layer.weight"] - weights["layer.weight"],
                           out["model.embed_tokens.weight"] - embed)
