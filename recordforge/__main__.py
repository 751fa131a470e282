"""`python -m recordforge ...` is the `recordforge` command."""

import sys

from recordforge.command import main

if __name__ == "__main__":
    sys.exit(main())
