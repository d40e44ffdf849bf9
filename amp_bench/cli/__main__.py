"""`python -m amp_bench.cli`, as before the command line became a package (`python -m amp_bench` is the usual way)."""
import sys

from amp_bench.cli import main

sys.exit(main())
