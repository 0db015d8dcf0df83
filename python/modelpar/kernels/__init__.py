"""Kernels: what runs each device's operators. ``kernels="aten"`` (the
default) calls every ATen operator through the dispatcher; with
``kernels="inductor"`` each run of a device's operators between transfers
is compiled by Inductor (Note [Kernel regions] in kernels/regions.py)."""

from .regions import KernelRegion, KernelRegions, graph_with_kernel_regions, with_kernel_regions

__all__ = ["KernelRegion", "KernelRegions", "graph_with_kernel_regions",
           "with_kernel_regions"]
