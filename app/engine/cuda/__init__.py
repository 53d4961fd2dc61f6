"""The CUDA runtime: the model's weights on the GPU (packed W4/W3 or fp16), the whole decode
step as one CUDA graph per batch-size bucket, prefill, and the VRAM planner.

``runner.CudaRunner`` implements the same Runner protocol as the CPU ``TorchRunner``.
"""
