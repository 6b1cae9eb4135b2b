"""On-policy distillation: the student samples, the teacher grades every token.

Agarwal et al. 2024, "On-Policy Distillation of Language Models: Learning from Self-Generated
Mistakes" (GKD); Lu & Thinking Machines Lab 2025, "On-Policy Distillation". The objective is the
reverse KL ``KL(π_s‖π_t) = Σ_v p_s(v) (log p_s(v) - log p_t(v))`` at each state the student
visits: mode-seeking, so the student learns to put its mass where the teacher is confident.

Two forms:
* ``reverse_kl_full`` — exact per-token KL over the vocabulary (needs the teacher's logits).
  With ``teacher_topk=k`` the comparison is restricted to the teacher's k most likely tokens S
  at each position: both distributions are renormalised on S (teacher: softmax of its logits on
  S; student: softmax of *its* logits on S) and the KL of the two renormalised distributions is
  returned. Design choice: this is a proper KL (≥ 0, 0 iff the student's conditional on S
  matches the teacher's) and stays finite, but it is blind to how much mass the student puts
  outside S — pair it with the sampled estimator, or pick k large enough that S holds nearly
  all of the teacher's mass. The teacher is always treated as constant (detached).
* ``reverse_kl_sampled`` — the one-sample estimator ``log p_s(x_t) - log p_t(x_t)`` at the token
  the student sampled (needs only the teacher's log-prob of that token). Its expectation under
  the student is the full reverse KL; used as a dense per-token reward ``-kl`` (detached) with a
  policy-gradient loss, as Lu & Thinking Machines do (``distill_reward``).
"""

from __future__ import annotations

import torch


def reverse_kl_full(
    student_logits_BTV: torch.Tensor,
    teacher_logits_BTV: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    teacher_topk: int | None = None,
) -> torch.Tensor:
    """Per-token ``KL(π_s‖π_t)`` over the vocabulary (or the teacher's top-k support).

    Args:
        student_logits_BTV: (B, T, V) student logits, with gradient.
        teacher_logits_BTV: (B, T, V) teacher logits (same vocabulary), detached here.
        mask_BT: (B, T) valid positions.
        teacher_topk: restrict to the teacher's top-k tokens per position (see module docstring).

    Returns:
        kl_BT: (B, T) fp32, 0 at masked positions.
    """
    if student_logits_BTV.shape != teacher_logits_BTV.shape:
        raise ValueError(
            f"student logits {tuple(student_logits_BTV.shape)} and teacher logits "
            f"{tuple(teacher_logits_BTV.shape)} must have the same shape"
        )
    s_BTV = student_logits_BTV.float()
    t_BTV = teacher_logits_BTV.detach().float()
    if teacher_topk is not None:
        if not 1 <= teacher_topk <= s_BTV.shape[-1]:
            raise ValueError(f"teacher_topk must be in [1, V={s_BTV.shape[-1]}], got {teacher_topk}")
        t_BTV, idx_BTK = t_BTV.topk(teacher_topk, dim=-1)
        s_BTV = s_BTV.gather(-1, idx_BTK)
    log_ps_BTV = torch.log_softmax(s_BTV, dim=-1)
    log_pt_BTV = torch.log_softmax(t_BTV, dim=-1)
    kl_BT = (log_ps_BTV.exp() * (log_ps_BTV - log_pt_BTV)).sum(-1)
    return torch.where(mask_BT.bool(), kl_BT, torch.zeros_like(kl_BT))


def reverse_kl_sampled(student_logp_BT: torch.Tensor, teacher_logp_BT: torch.Tensor) -> torch.Tensor:
    """Per-token estimator ``log p_s(x_t) - log p_t(x_t)`` at the student's sampled tokens, (B, T).

    Not detached; mask it yourself. Unbiased for the reverse KL when x_t ~ π_s.
    """
    return student_logp_BT - teacher_logp_BT


def distill_reward(
    student_logp_BT: torch.Tensor, teacher_logp_BT: torch.Tensor, mask_BT: torch.Tensor
) -> torch.Tensor:
    """Dense per-token reward ``-(log p_s - log p_t)``, detached, 0 at masked positions, (B, T).

    Feed it as the per-token advantage of ``policy.pg_loss``/``ppo_clip_loss`` (discount 0:
    each token is graded on its own, as in Lu & Thinking Machines 2025).
    """
    r_BT = -reverse_kl_sampled(student_logp_BT.detach(), teacher_logp_BT.detach()).float()
    return torch.where(mask_BT.bool(), r_BT, torch.zeros_like(r_BT))
