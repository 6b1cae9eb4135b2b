import dataclasses

import pytest

from posttrain.config import ConfigValueError, describe_config, load_config, save_config
from posttrain.errors import UserError


@dataclasses.dataclass(kw_only=True)
class Inner:
    lr: float = 1e-3
    """Learning rate."""
    betas: list[float] = dataclasses.field(default_factory=lambda: [0.9, 0.95])
    """AdamW betas."""

    def __post_init__(self):
        if self.lr <= 0:
            raise ConfigValueError("lr", "must be > 0")


@dataclasses.dataclass(kw_only=True)
class Outer:
    name: str = "run"
    """Run name."""
    steps: int = 10
    """Number of steps."""
    use_x: bool = False
    """A switch."""
    optim: Inner = dataclasses.field(default_factory=Inner)
    """Optimizer."""
    tag: str | None = None
    """Optional tag."""


def write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_yaml_overlay_then_overrides_with_coercion(tmp_path):
    p = write(tmp_path, "steps: 5\noptim:\n  lr: 0.01\n")
    cfg = load_config(Outer, p, ["optim.lr=3e-4", "use_x=true", "name=abc", "optim.betas=[0.8, 0.9]"])
    assert cfg.steps == 5 and cfg.optim.lr == pytest.approx(3e-4) and cfg.use_x is True
    assert cfg.name == "abc" and cfg.optim.betas == [0.8, 0.9] and cfg.tag is None


@dataclasses.dataclass(kw_only=True)
class Tuned:
    optim: Inner = dataclasses.field(default_factory=lambda: Inner(lr=5e-5, betas=[0.9, 0.999]))
    """A section whose defaults differ from Inner's own."""


def test_setting_one_key_keeps_the_sections_own_defaults(tmp_path):
    cfg = load_config(Tuned, None, ["optim.lr=1e-4"])
    assert cfg.optim.lr == pytest.approx(1e-4) and cfg.optim.betas == [0.9, 0.999]
    cfg = load_config(Tuned, write(tmp_path, "optim:\n  betas: [0.8, 0.9]\n"))
    assert cfg.optim.lr == pytest.approx(5e-5) and cfg.optim.betas == [0.8, 0.9]
    assert load_config(Tuned, None, []).optim == Inner(lr=5e-5, betas=[0.9, 0.999])


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(Outer, None, ["steps=7", "tag=t"])
    save_config(cfg, tmp_path / "r.yaml")
    assert load_config(Outer, tmp_path / "r.yaml") == cfg


@pytest.mark.parametrize("text,needle", [
    ("steps: [1, 2\n", "c.yaml:2: malformed YAML"),
    ("stepz: 3\n", "c.yaml: unknown key 'stepz' (did you mean 'steps'?)"),
    ("optim:\n  lrr: 3\n", "c.yaml: unknown key 'optim.lrr'"),
    ("steps: abc\n", "c.yaml: steps: expected an integer, got 'abc'"),
    ("use_x: 3\n", "c.yaml: use_x: expected true or false"),
    ("optim:\n  lr: -1\n", "c.yaml: optim.lr: must be > 0"),
    ("optim: 3\n", "c.yaml: optim: expected a mapping"),
    ("- a\n- b\n", "expected a mapping of keys at the top level"),
])
def test_bad_yaml_names_file_and_key(tmp_path, text, needle):
    with pytest.raises(UserError) as e:
        load_config(Outer, write(tmp_path, text))
    assert needle in str(e.value)
    assert "\n" not in str(e.value)


def test_bad_override_names_command_line(tmp_path):
    with pytest.raises(UserError, match=r"command line: optim.lr: expected a number"):
        load_config(Outer, write(tmp_path, "steps: 1\n"), ["optim.lr=fast"])
    with pytest.raises(UserError, match="not of the form key=value"):
        load_config(Outer, None, ["steps"])


def test_missing_file_is_named(tmp_path):
    with pytest.raises(UserError, match="nope.yaml: config file not found"):
        load_config(Outer, tmp_path / "nope.yaml")


def test_describe_lists_dotted_keys_with_docs():
    text = describe_config(Outer)
    assert "optim.lr (float, default 0.001)" in text and "Learning rate." in text
