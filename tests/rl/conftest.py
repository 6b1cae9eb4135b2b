"""RL test fixtures: a user's reward plugin module importable by path, and a config builder."""

import contextlib
import sys
import textwrap

import pytest

PLUGIN = textwrap.dedent('''
    from posttrain.outcome import Outcome

    def letters(completion, example):
        """Fraction of letters: a dense reward a random policy can climb quickly."""
        if not completion:
            return Outcome.model_fail("empty", reward=0.0)
        frac = sum(c.isalpha() for c in completion) / len(completion)
        return Outcome.passed(reward=frac) if frac > 0.99 else Outcome.model_fail(reward=frac)

    def constant(completion, example):
        return Outcome.model_fail(reward=0.5)

    def half_flat(completion, example):
        """Zero-variance groups for odd answers, the letters reward for even ones."""
        return Outcome.model_fail(reward=0.5) if int(example["answer"]) % 2 else letters(completion, example)

    def even_length(completion, example):
        """Passes about half of sampled texts, and the same half every time for the same text."""
        return Outcome.passed() if len(completion) % 2 == 0 else Outcome.model_fail()

    def flaky(completion, example):
        if len(completion) % 2:
            raise RuntimeError("verifier crashed")
        return Outcome.model_fail(reward=float(len(completion) % 3))
''')


@pytest.fixture
def reward_plugin(tmp_path, monkeypatch):
    """A module ``rl_test_rewards`` on sys.path, as a user's own reward file would be."""
    (tmp_path / "rl_test_rewards.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    # imported afresh from this folder: an earlier test's copy may be cached, its folder gone
    monkeypatch.delitem(sys.modules, "rl_test_rewards", raising=False)
    return "rl_test_rewards"


@contextlib.contextmanager
def reward_module_root(tmp_path_factory, name: str):
    """A folder holding ``rl_test_rewards.py``, on sys.path while the context lasts: for module-scoped
    fixtures, whose runs (and the ranks they launch) import the user's reward module from it."""
    root = tmp_path_factory.mktemp(name)
    (root / "rl_test_rewards.py").write_text(PLUGIN)
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(root))
        yield root


def rl_args(model_dir, data_dir, **extra) -> list[str]:
    """Dotted overrides for a small, fast RL run on the nano model (no out_dir unless given)."""
    base = {"model.path": model_dir, "data.path": data_dir / "prompts_train.jsonl",
            "rollout.group_size": 4, "rollout.max_new_tokens": 8, "prompts_per_step": 4,
            "num_steps": 2, "eval_every": 0, "save_every": 0, "logging.progress": False, "optim.lr": 1e-3}
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


@pytest.fixture
def rl_overrides(nano_model_dir, arith_data_dir, tmp_path):
    """Dotted overrides for a small, fast RL run on the nano model."""
    def make(**extra):
        return rl_args(nano_model_dir, arith_data_dir, **{"out_dir": tmp_path / "run", **extra})
    return make
