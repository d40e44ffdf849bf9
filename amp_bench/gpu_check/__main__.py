"""python -m amp_bench.gpu_check summary WORK OUT --part N [--final] | matmul FILE (summary.py) | plan --part N
(plan.py: the script reads it before each part, without summary's pandas)"""
import sys

if sys.argv[1:2] == ["plan"]:
    from amp_bench.gpu_check.plan import main
    sys.exit(main(sys.argv[2:]))
from amp_bench.gpu_check.summary import main

sys.exit(main(sys.argv[1:]))
