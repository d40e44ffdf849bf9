"""A one-to-two-minute diagnostic for a lent GPU host, to run early in a device window from the
project's root: `python3 scripts/gpu_diagnose.py` (DEVELOPERS.md, "The GPU check").

It answers, on the real host, the questions a CPU cannot:
  - what `import torch` (and the model libraries) map and start: the CUDA driver library, NVML,
    threads; what the project's own fork rule (amp_bench.platform.forking) says about it;
  - whether a process that imported torch but never initialised CUDA can fork a child that then
    initialises CUDA and trains (the fork server's premise on a GPU host);
  - where a ResNet-50 case's first seconds go: model build, the first step (cuDNN autotuning at
    batch 256), steady steps, per mode.
It prints one JSON document. It changes nothing on the machine."""
import json
import os
import sys
import time
from pathlib import Path

# the project's fork server imports with one OpenMP thread (each child sets its own): mirror it
os.environ.setdefault("OMP_NUM_THREADS", "1")
out = {"OMP_NUM_THREADS": os.environ["OMP_NUM_THREADS"]}


def mapped():
    keys = ("libcuda.so", "libnvidia-ml", "libcudart", "libcublas")
    maps = Path("/proc/self/maps").read_text().splitlines()
    return sorted({line.split()[-1].rsplit("/", 1)[-1] for line in maps if any(k in line for k in keys)})


def threads():
    return len(os.listdir("/proc/self/task"))


t = time.perf_counter()
import torch  # after the clock starts: its import is what is timed

out["torch"] = torch.__version__
out["import_torch_s"] = round(time.perf_counter() - t, 2)
out["after_import_torch"] = {"mapped": mapped(), "threads": threads(),
                             "cuda_initialized": torch.cuda.is_initialized()}
t = time.perf_counter()
import torchvision.models  # the model libraries, timed, to see what they map and start
import transformers  # noqa: F401 - imported for that alone

out["import_models_s"] = round(time.perf_counter() - t, 2)
out["after_import_models"] = {"mapped": mapped(), "threads": threads(),
                              "cuda_initialized": torch.cuda.is_initialized()}
sys.path.insert(0, os.getcwd())
try:
    from amp_bench.platform.forking import unsafe_to_fork
    out["project_fork_rule_says"] = unsafe_to_fork() or "safe"
except Exception as exc:  # the project may have moved it: say so, go on
    out["project_fork_rule_says"] = f"could not ask: {exc!r}"

# a child forked from this process (torch imported, CUDA never initialised) initialises CUDA and trains
t = time.perf_counter()
pid = os.fork()
if pid == 0:
    try:
        if not torch.cuda.is_available():
            os._exit(4)
        m = torch.nn.Linear(1024, 1024).cuda()
        loss = m(torch.randn(64, 1024, device="cuda")).square().mean()
        loss.backward()
        torch.cuda.synchronize()
        os._exit(0)
    except Exception as exc:
        sys.stderr.write(f"forked child: {exc!r}\n")
        os._exit(3)
_, status = os.waitpid(pid, 0)
code = os.waitstatus_to_exitcode(status)
out["forked_child_trains_on_cuda"] = {0: "yes", 3: "no (error above)", 4: "no GPU visible"}.get(code, f"exit {code}")
out["forked_child_s"] = round(time.perf_counter() - t, 2)

if torch.cuda.is_available():
    torch.backends.cudnn.benchmark = True
    x = torch.randn(256, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (256,), device="cuda")
    phases = {}
    for mode, dtype in (("fp32", None), ("amp_fp16", torch.float16), ("amp_bf16", torch.bfloat16)):
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        t = time.perf_counter()
        model = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
        opt = torch.optim.AdamW(model.parameters(), fused=True)
        scaler = torch.amp.GradScaler("cuda", enabled=dtype is torch.float16)
        torch.cuda.synchronize()
        build = time.perf_counter() - t
        steps = []
        for _ in range(6):
            t = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            torch.cuda.synchronize()
            steps.append(time.perf_counter() - t)
        phases[mode] = {"build_s": round(build, 2), "first_step_s": round(steps[0], 2),
                        "second_step_s": round(steps[1], 3), "steady_step_s": round(sorted(steps[2:])[1], 4)}
        del model, opt
        torch.cuda.empty_cache()
    out["resnet50_bs256_cl"] = phases
print(json.dumps(out, indent=1))
