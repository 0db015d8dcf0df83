"""The IR's names of torch's dtypes, layouts and memory formats (the text
format's ``f32``, ``layout.strided``, ``memory_format.channels_last``), both
ways: the FX importer writes them, the kernel regions read them back."""

from __future__ import annotations

import torch

__all__ = ["DTYPE_NAMES", "LAYOUT_NAMES", "MEMORY_FORMAT_NAMES",
           "TORCH_DTYPES", "TORCH_LAYOUTS", "TORCH_MEMORY_FORMATS"]

#: torch dtype -> IR name
DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.bool: "bool", torch.uint8: "u8", torch.int8: "i8", torch.int16: "i16",
    torch.int32: "i32", torch.int64: "i64", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.float32: "f32", torch.float64: "f64", torch.complex64: "c64", torch.complex128: "c128",
    torch.float8_e4m3fn: "f8e4m3fn", torch.float8_e5m2: "f8e5m2",
}
LAYOUT_NAMES: dict[torch.layout, str] = {
    torch.strided: "strided", torch.sparse_coo: "sparse_coo", torch.sparse_csr: "sparse_csr",
    torch._mkldnn: "mkldnn"}  # type: ignore[attr-defined]
MEMORY_FORMAT_NAMES: dict[torch.memory_format, str] = {
    torch.contiguous_format: "contiguous_format", torch.preserve_format: "preserve_format",
    torch.channels_last: "channels_last", torch.channels_last_3d: "channels_last_3d"}

#: IR name -> torch object
TORCH_DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}
TORCH_LAYOUTS = {name: layout for layout, name in LAYOUT_NAMES.items()}
TORCH_MEMORY_FORMATS = {name: fmt for fmt, name in MEMORY_FORMAT_NAMES.items()}
