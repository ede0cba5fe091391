"""``python -m fqbroker`` runs fqd."""

import sys

from .cli import fqd

sys.exit(fqd())
