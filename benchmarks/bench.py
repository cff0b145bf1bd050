#!/usr/bin/env python3
"""Entry point for the side-by-side benchmark; the implementation ships in the package
(`instanttensor.bench`) so `python -m instanttensor bench` works from an installed wheel.

    python benchmarks/bench.py --size-gb 4 --json benchmarks/latest.json
"""

import sys

from instanttensor.bench import main

if __name__ == "__main__":
    sys.exit(main())
