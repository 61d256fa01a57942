"""``python -m kimik3_operator`` is ``kimik3``; ``kopf run -m kimik3_operator`` registers the handlers."""

import sys

from kimik3_operator.cli import main

if __name__ == "__main__":
    sys.exit(main())
