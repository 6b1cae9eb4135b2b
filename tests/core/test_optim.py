"""The optimizer: AdamW in torch's fused kernel where the parameters allow it, the same step as the
default per-tensor loop."""

import torch

from posttrain.core.optim import OptimConfig, build_optimizer


def test_adamw_is_fused_on_the_cpu_and_takes_the_loops_step():
    torch.manual_seed(0)
    cfg = OptimConfig(lr=1e-2, weight_decay=0.1)
    params = [torch.nn.Parameter(torch.randn(8, 5)), torch.nn.Parameter(torch.randn(5)),
              torch.nn.Parameter(torch.randn(3), requires_grad=False)]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params[:2]]
    ours = build_optimizer(params, cfg)
    loop = torch.optim.AdamW(twins, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                             weight_decay=cfg.weight_decay, foreach=False)
    assert ours.defaults["fused"] and len(ours.param_groups[0]["params"]) == 2  # the frozen one left out
    for _ in range(3):
        for p, q in zip(params, twins):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        ours.step()
        loop.step()
    for p, q in zip(params, twins):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)
