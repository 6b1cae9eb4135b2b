"""``python -m posttrain`` (and ``torchrun ... -m posttrain``): the command line."""

import sys

from posttrain.cli import main

sys.exit(main())
