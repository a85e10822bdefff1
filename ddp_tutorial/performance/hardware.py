"""Published hardware: one set of figures per GPU, each with its source (issue 39, "How fast, and why").

The step-time model (``stepmodel``) turns FLOPs and bytes into seconds with these figures and
nothing else. They are read off public documents, never fitted to a run the model predicts:

- ``peak_flops``: the dense bf16 tensor-core peak of the data sheet (no sparsity: the sheets'
  headline figure is often twice this, with 2:4 sparsity). MFU is measured against it.
- ``achievable_flops``: the best a large bf16 ``matmul`` reaches, measured (Stas Bekman's
  "Maximum Achievable Matmul FLOPS", MAMF, in *Machine Learning Engineering*): what the model
  assumes a step's matmuls run at.
- ``hbm_bytes_per_s``: memory bandwidth (the roofline's other roof).
- ``nvlink_bytes_per_s``: NVLink bandwidth per GPU, one direction (NVIDIA quotes both directions
  added: 600, 900, 1800 GB/s; a ring sends one way while it receives the other).
- ``network_bytes_per_s``: the scale-out network per GPU, one direction (one NIC per GPU).
- ``latency_s``: the ``alpha`` of each ring step of a collective, the same on every link here.

    >>> round(H100.peak_flops / H100.hbm_bytes_per_s)  # the ridge point, FLOPs per byte
    295
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Hardware", "A100", "H100", "H200", "B200", "HARDWARE", "GPUS_PER_NODE"]

GPUS_PER_NODE = 8  # HGX/DGX boards: eight GPUs on one NVLink switch, the rest over the network

MAMF = ("S. Bekman, Machine Learning Engineering (github.com/stas00/ml-engineering), "
        "compute/accelerator/README.md, 'Maximum Achievable Matmul FLOPS comparison table', BF16")
MAMF_B200 = ("S. Bekman, Machine Learning Engineering, 'When is it worth upgrading GPUs?', MAMF table BF16 "
             "(H100/H200 SXM 794.5, B200 SXM 1745.0 TFLOPS)")
PEAK = ("S. Bekman, Machine Learning Engineering, compute/accelerator/README.md, 'TFLOPS comparison table', "
        "BF16 dense column (NVIDIA data sheets, without sparsity)")
HBM = "S. Bekman, Machine Learning Engineering, compute/accelerator/README.md, 'Accelerator memory size and speed'"
NVLINK = ("NVIDIA data sheets: NVLink 600 GB/s (A100 SXM), 900 GB/s (H100, H200 SXM), 1.8 TB/s (B200), "
          "both directions added; halved here for one direction")
SELENE = ("Narayanan et al. 2021, 'Efficient Large-Scale Language Model Training on GPU Clusters Using "
          "Megatron-LM', section 5: eight 200 Gb/s HDR InfiniBand HCAs per 8-GPU node (25 GB/s per GPU)")
LLAMA3_NET = ("Grattafiori et al. 2024, 'The Llama 3 Herd of Models', section 3.3.1: RoCE and InfiniBand "
              "fabrics, 400 Gb/s interconnects between GPUs (50 GB/s per GPU)")
ALPHA = ("NCCL Simple protocol, about 6 us per ring hop (protocol table of 'NCCL performance' notes, "
         "the-dsvolk.github.io/ai-perf, after Hu et al. 2025, 'Demystifying NCCL')")
GB, TB, TFLOPS = 1e9, 1e12, 1e12


@dataclass(frozen=True)
class Hardware:
    """One GPU as the step-time model sees it; ``sources`` names where each figure comes from."""

    name: str
    peak_flops: float
    achievable_flops: float
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float
    network_bytes_per_s: float
    latency_s: float = 6e-6
    sources: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not 0 < self.achievable_flops <= self.peak_flops:
            raise ValueError(f"{self.name}: achievable {self.achievable_flops} must be in (0, peak {self.peak_flops}]")
        missing = {"peak_flops", "achievable_flops", "hbm_bytes_per_s", "nvlink_bytes_per_s",
                   "network_bytes_per_s", "latency_s"} - set(self.sources)
        if missing:
            raise ValueError(f"{self.name}: no source for {', '.join(sorted(missing))}")


def _sources(mamf: str, network: str) -> dict[str, str]:
    return {"peak_flops": PEAK, "achievable_flops": mamf, "hbm_bytes_per_s": HBM, "nvlink_bytes_per_s": NVLINK,
            "network_bytes_per_s": network, "latency_s": ALPHA}


A100 = Hardware("A100 SXM 80GB", 312 * TFLOPS, 271.2 * TFLOPS, 2.0 * TB, 300 * GB, 25 * GB,
                sources=_sources(MAMF + " (A100 SXM 271.2 of 312)", SELENE))
H100 = Hardware("H100 SXM", 989 * TFLOPS, 794.5 * TFLOPS, 3.35 * TB, 450 * GB, 50 * GB,
                sources=_sources(MAMF + " (H100 SXM 794.5 of 989)", LLAMA3_NET))
# H200 is an H100 with more, faster memory: the same chip, the same MAMF (MAMF_B200's table row "H100/H200")
H200 = Hardware("H200 SXM", 989 * TFLOPS, 794.5 * TFLOPS, 4.8 * TB, 450 * GB, 50 * GB,
                sources=_sources(MAMF_B200, LLAMA3_NET + "; assumed the same for H200 and B200 clusters"))
B200 = Hardware("B200 SXM", 2250 * TFLOPS, 1745.0 * TFLOPS, 8.0 * TB, 900 * GB, 50 * GB,
                sources=_sources(MAMF_B200, LLAMA3_NET + "; assumed the same for H200 and B200 clusters"))
HARDWARE = {h.name: h for h in (A100, H100, H200, B200)}
