"""``python -m fqbroker`` runs fqd."""

import sys

from fqbroker.cli import fqd

sys.exit(fqd())
