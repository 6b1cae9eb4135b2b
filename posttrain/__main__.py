"""``python -m posttrain`` (and ``torchrun ... -m posttrain``): the command line."""

from posttrain.cli import entry

entry()
