"""python -m amp_bench.gpu_check summary WORK OUT --part N [--final] | matmul FILE | plan --part N (summary.py)"""
import sys

from amp_bench.gpu_check.summary import main

sys.exit(main(sys.argv[1:]))
