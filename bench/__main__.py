"""`python -m bench`: run the benchmarks (see bench.suite)."""

import sys

from bench.suite import main

if __name__ == "__main__":
    sys.exit(main())
