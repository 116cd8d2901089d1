"""GPUs through NVML: discovery, usage, health, and the Device object (docs/koordinator.md §5.4, §7.1).

`GPUService.start()` is the entry point for koordlet; it returns None on nodes without NVML or
GPUs, and the GPU parts (collector, Device reporter, device plugin) stay off there.
"""
