"""The output head in chunks: log-probs, entropies and the gradients of hidden states, weight and
bias equal the plain path's (full logits, log_softmax) for any chunk size, temperature and dtype."""

import pytest
import torch

from posttrain.algos.head import head_entropy, head_of, head_token_logprobs, hidden_head, movable_head


def _plain(h, w, b, x, tau):
    z = torch.nn.functional.linear(h, w, b).float() / tau
    return z.log_softmax(-1).gather(-1, x[..., None]).squeeze(-1), z


def _case(dtype=torch.float32, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(3, 7, 16, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(50, 16, generator=g) / 4).to(dtype).requires_grad_()
    b = (torch.randn(50, generator=g) / 4).to(dtype).requires_grad_() if bias else None
    x = torch.randint(0, 50, (3, 7), generator=g)
    weights = torch.randn(3, 7, generator=g)  # a loss that weighs each position differently
    return h, w, b, x, weights


def _grads(fn, h, w, b, weights):
    for t in (h, w, b):
        if t is not None:
            t.grad = None
    out = fn()
    (out * weights).sum().backward()
    return out.detach(), [t.grad.clone() for t in (h, w, b) if t is not None]


@pytest.mark.parametrize("rows", [1, 4, 21, 1000])
@pytest.mark.parametrize("tau", [1.0, 0.7])
@pytest.mark.parametrize("bias", [True, False])
def test_chunked_head_equals_full_logits_with_their_gradients(rows, tau, bias):
    h, w, b, x, weights = _case(bias=bias)
    want, want_grads = _grads(lambda: _plain(h, w, b, x, tau)[0], h, w, b, weights)
    got, got_grads = _grads(lambda: head_token_logprobs(h, w, b, x, tau, chunk_rows=rows), h, w, b, weights)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    for g, e in zip(got_grads, want_grads):
        torch.testing.assert_close(g, e, atol=1e-6, rtol=1e-5)
    z = _plain(h, w, b, x, tau)[1]
    want_ent = -(z.softmax(-1) * z.log_softmax(-1)).sum(-1)
    torch.testing.assert_close(head_entropy(h, w, b, tau, chunk_rows=rows), want_ent.detach(), atol=1e-5, rtol=1e-5)


def test_bf16_inputs_give_fp32_results_close_to_the_fp32_path():
    h, w, b, x, weights = _case(torch.bfloat16)
    got, got_grads = _grads(lambda: head_token_logprobs(h, w, b, x, chunk_rows=5), h, w, b, weights)
    assert got.dtype == torch.float32 and all(g.dtype == torch.bfloat16 for g in got_grads)
    want, want_grads = _grads(lambda: _plain(h, w, b, x, 1.0)[0], h, w, b, weights)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)  # the same fp32 math on bf16 inputs
    for g, e in zip(got_grads, want_grads):
        torch.testing.assert_close(g.float(), e.float(), atol=2e-2, rtol=2e-2)


def test_the_model_returns_its_final_hidden_states_inside_hidden_head(nano_model_dir):
    from posttrain.models.hf import ModelConfig, load_model

    model = load_model(ModelConfig(path=str(nano_model_dir)))
    ids = torch.randint(5, 200, (2, 9))
    logits = model(input_ids=ids).logits
    with hidden_head(model):
        hidden = model(input_ids=ids).logits
    assert hidden.shape == (2, 9, model.config.hidden_size)
    w, b = head_of(model)
    torch.testing.assert_close(torch.nn.functional.linear(hidden, w, b), logits, atol=1e-5, rtol=1e-5)
    assert model(input_ids=ids).logits.shape[-1] == model.config.vocab_size  # the head is back


def test_heads_that_cannot_move_out_of_the_forward_keep_full_logits(nano_model_dir):
    from peft import LoraConfig, get_peft_model
    from posttrain.models.hf import ModelConfig, load_model

    model = load_model(ModelConfig(path=str(nano_model_dir)))
    assert movable_head(model)
    model.config.final_logit_softcapping = 30.0  # Gemma 2's soft cap: applied after the head
    assert not movable_head(model)
    model.config.final_logit_softcapping = None
    lora_head = get_peft_model(model, LoraConfig(r=2, target_modules=["lm_head"]))
    assert not movable_head(lora_head)
