"""A CUDA GPU: CUDA events time the steps, the caching allocator counts and caps the memory, NVML
meters the device, and the datasheet table gives the peak rate. Every torch.cuda call goes through
`self.cuda` (torch.cuda unless a test gives a fake), so the logic runs on a CPU."""
from __future__ import annotations

import os

from amp_bench.measure.devices.base import DeviceOps


def warm_cuda_libraries(torch_device) -> None:
    """The same library state in every mode before the baseline: cuBLAS handles and workspaces (an
    fp32, fp16 and, from compute capability 8.0, bf16 GEMM) and cuDNN's (a convolution). Without it
    the AMP modes' autocast proof made them before the baseline and fp32's first matmul after it."""
    import torch
    x = torch.ones(64, 64, device=torch_device)
    dtypes = [torch.float32, torch.float16]
    if torch.cuda.get_device_capability(torch_device) >= (8, 0):
        dtypes.append(torch.bfloat16)
    for dtype in dtypes:
        torch.nn.functional.linear(x.to(dtype), x.to(dtype))
    torch.nn.functional.conv2d(torch.ones(1, 8, 8, 8, device=torch_device), torch.ones(8, 8, 3, 3, device=torch_device))


class CudaOps(DeviceOps):
    type = "cuda"
    dist_backend = "nccl"
    padded_gemms_differ = True

    def __init__(self, torch_device, cuda=None, warm=None):
        super().__init__(torch_device)
        self._cuda, self._warm = cuda, warm
        self._retries_at_reset = 0  # num_alloc_retries when the peaks were last reset

    @property
    def cuda(self):
        if self._cuda is not None:
            return self._cuda
        import torch
        return torch.cuda

    @property
    def index(self) -> int:
        """The GPU's index: torch.device('cuda', 1), 'cuda:1' -> 1; 'cuda' -> 0."""
        if isinstance(self.torch_device, str):
            _, _, index = self.torch_device.partition(":")
            return int(index) if index else 0
        return self.torch_device.index or 0

    # ------------------------------------------------------------------ place and order

    def for_rank(self, rank, device) -> CudaOps:
        """Rank r of a node takes GPU (device.index + local_rank)."""
        import torch
        return type(self)(torch.device("cuda", (device.index or 0) + rank.local_rank), self._cuda, self._warm)

    def check_ranks(self, device, local_world_size: int) -> str | None:
        count = self.cuda.device_count()
        needed = (device.index or 0) + local_world_size
        if needed > count:
            return (f"nproc_per_node={local_world_size} from {device.torch_device} needs {needed} GPUs on this "
                    f"node, {count} visible")
        return None

    def ddp_kwargs(self) -> dict:
        return {"device_ids": [self.index], "output_device": self.index}

    def make_current(self) -> None:
        self.cuda.set_device(self.torch_device)

    def synchronize(self) -> None:
        self.cuda.synchronize(self.torch_device)

    def fp32_math_env(self):
        return os.environ  # TORCH_ALLOW_TF32_CUBLAS_OVERRIDE and its like act on CUDA only

    # ------------------------------------------------------------------ memory

    def cap_memory(self, case) -> dict:
        """The caching allocator's per-process fraction of the device."""
        cap_bytes = case.memory_cap_bytes
        total = self.cuda.get_device_properties(self.torch_device).total_memory
        self.cuda.set_per_process_memory_fraction(min(1.0, cap_bytes / total), self.torch_device)
        return {"memory_cap_bytes": cap_bytes, "memory_cap_kind": "cuda allocator fraction of the device"}

    def _alloc_retries(self) -> int | None:
        return self.cuda.memory_stats(self.torch_device).get("num_alloc_retries")

    def reset_peak_memory(self) -> None:
        self.cuda.synchronize(self.torch_device)
        self.cuda.reset_peak_memory_stats(self.torch_device)
        # reset_peak_memory_stats leaves the accumulated counters alone: the window's retries are a difference
        self._retries_at_reset = self._alloc_retries() or 0

    def peak_memory_columns(self) -> dict:
        retries = self._alloc_retries()
        return {"peak_mem_allocated_bytes": self.cuda.max_memory_allocated(self.torch_device),
                "peak_mem_reserved_bytes": self.cuda.max_memory_reserved(self.torch_device),
                "cuda_num_alloc_retries": None if retries is None else retries - self._retries_at_reset}

    def profiler_activities(self) -> tuple[list, object]:
        """CPU and CUDA activity, CUPTI's start-up paid before (profile.warm_cuda_profiler); every kernel
        a step launched ends inside its region (synchronize)."""
        from torch.profiler import ProfilerActivity

        from amp_bench.measure.telemetry.profile import warm_cuda_profiler
        warm_cuda_profiler()
        self.synchronize()
        return [ProfilerActivity.CPU, ProfilerActivity.CUDA], self.synchronize

    def host_threads(self, num_threads: int) -> int:
        """A GPU step needs about one host core to launch its kernels, whatever torch's CPU thread
        pool is (16 on a 16-core host): judged on 16, a GPU row would read as contended as soon as
        other processes used a few cores."""
        return 1

    def phase_probe(self):
        from amp_bench.measure.telemetry.phase_memory import CudaPhaseProbe
        return CudaPhaseProbe(self.torch_device, cuda=self._cuda)

    # ------------------------------------------------------------------ telemetry and the window

    def open_telemetry(self, device, rank=None) -> tuple:
        """(NVML reader, idle used-memory baseline, {}) for this GPU, or (None, None, the reason as nvml_notes).
        Under DDP every rank takes part (a barrier), NVML or not."""
        import torch

        from amp_bench.platform.nvml import NvmlReader, cuda_identity, device_handle, load_nvml
        # create the CUDA context first: torch makes it lazily, and the baseline must include it on
        # every device index alike, so that the delta is the model's and the step's memory alone
        torch.zeros(1, device=self.torch_device)
        self.cuda.synchronize(self.torch_device)
        reader, notes = None, {}
        try:
            nvml = load_nvml()
            handle, note = device_handle(nvml, *cuda_identity(self.index))
            reader = NvmlReader(nvml, handle, note)
        except Exception as exc:  # no library, no driver, no device: the run goes on without NVML
            notes = {"nvml_notes": str(exc).splitlines()[0] if str(exc) else type(exc).__name__}
        baseline = self.nvml_baseline(reader, rank)  # on every rank alike: it holds a collective
        return (reader, baseline, notes) if reader is not None else (None, None, notes)

    def nvml_baseline(self, reader, rank=None) -> int | None:
        """NVML `used` of the idle process, taken at the same point in every mode: after the CUDA
        context, the process group (DDP: a barrier, so NCCL's communicator and buffers exist and are
        not counted as training memory) and the same library warm-up, before the model exists."""
        if rank is not None:
            rank.barrier()
        (self._warm or warm_cuda_libraries)(self.torch_device)
        self.cuda.synchronize(self.torch_device)
        self.cuda.empty_cache()  # the warm-up's tensors back to the driver: the baseline holds none
        return reader.memory_used() if reader is not None else None

    def settle(self, step, inputs, target, reader, steps_taken: int = 0) -> dict:
        """cudnn.benchmark's search left its workspaces cached, so the reserved peak and NVML `used`
        would report the search's high-water mark: synchronize, empty_cache(), one untimed step (the
        allocator reserves what the step itself needs), synchronize, reset the peaks, then NVML
        `used` as the window opens."""
        self.cuda.synchronize(self.torch_device)
        self.cuda.empty_cache()
        step.untimed_step(inputs, target)  # under DDP every rank runs it: it all-reduces like any step
        self.reset_peak_memory()
        return {"settle_steps": 1, **({} if reader is None else {"nvml_mem_used_settled_bytes": reader.memory_used()})}

    def step_timer(self, max_steps: int):
        """A pair of CUDA events per step, created (not yet recorded) before the window."""
        from amp_bench.measure.window import CudaStepTimer
        cuda = self.cuda
        return CudaStepTimer(lambda: cuda.Event(enable_timing=True), cuda.synchronize, max_steps)

    def peak_rates(self, device_name: str, precision: str) -> tuple:
        from amp_bench import modes
        from amp_bench.platform.peaks import peak_tflops
        peak, source = peak_tflops(device_name, precision)
        if peak:  # which of the datasheet's rates mfu is against
            source = f"{modes.get(precision).peak_math} dense peak: {source}"
        return peak, source, peak_tflops(device_name, "amp_bf16")[0]
