"""`python -m synthetic OUT --schedule 1f1b --p 4 --m 8 ...`: write a synthetic run directory."""

import sys

from synthetic.cli import main

if __name__ == "__main__":
    sys.exit(main())
