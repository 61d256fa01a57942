"""``python -m kimik3_operator`` is the ``kimik3`` command."""

import sys

from kimik3_operator.cli import main

if __name__ == "__main__":
    sys.exit(main())
