import sys

from amp_bench.cli import main

sys.exit(main())
