"""``python -m fqbroker`` runs fqd."""

import sys

from fqbroker.cli.fqd import fqd

sys.exit(fqd())
