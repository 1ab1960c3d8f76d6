"""Peak Tensor Core rates of known GPUs, for MFU and HFU (explain.efficiency); kept
free of heavy imports so that the CLI can list the GPUs and precisions it knows."""

from __future__ import annotations

# Dense peak FLOP/s per GPU by dtype. NVIDIA datasheets quote Tensor Core rates
# "with sparsity"; the dense rate is half of that.
PEAKS: dict[str, dict[str, float]] = {
    # NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column (989.4 TFLOPS BF16 dense).
    "H100 SXM": {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp8": 1978.9e12},
    # Same datasheet, H100 PCIe column.
    "H100 PCIe": {"bf16": 756.0e12, "fp16": 756.0e12, "tf32": 378.0e12, "fp8": 1513.0e12},
    # NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column (same GH100 compute as H100 SXM).
    "H200": {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp8": 1978.9e12},
    # NVIDIA A100 Tensor Core GPU datasheet (SXM and PCIe share the dense rates; no FP8).
    "A100": {"bf16": 312.0e12, "fp16": 312.0e12, "tf32": 156.0e12},
    # NVIDIA HGX B200 specifications, per GPU (9 PF FP8, 4.5 PF BF16, 2.2 PF TF32 sparse).
    "B200": {"bf16": 2.25e15, "fp16": 2.25e15, "tf32": 1.1e15, "fp8": 4.5e15},
}
DTYPES: tuple[str, ...] = ("bf16", "fp16", "tf32", "fp8")
