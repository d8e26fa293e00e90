"""oneDNN int8 weights that can be saved packed.

``onednn::qlinear_prepack`` reorders an int8 weight matrix into oneDNN's blocked layout,
which takes seconds for a 1.5B model (as does fbgemm's prepacking). The packed tensor is an
opaque ``torch._mkldnn`` tensor, but its bytes and its serialized memory descriptor can be
read (``mkldnn.data_ptr``, ``mkldnn._nbytes``, ``mkldnn._get_mkldnn_serialized_md``) and a
tensor can be rebuilt over saved bytes through AOTInductor's C shim
(``aoti_torch_create_tensor_from_blob_v2``, the route AOTInductor itself uses for packed
constants). The rebuilt tensor does not own its bytes: the caller keeps them alive.

The blocked layout depends on the CPU's instruction set and the oneDNN version, so saved
blobs are only valid with the same :func:`verispec.models.native.kernels.signature`.
"""

from __future__ import annotations

import ctypes
import os
from functools import cache

import torch
from torch import Tensor

__all__ = ["available", "pack", "restore", "save"]


def available() -> bool:
    """oneDNN's int8 linear is in this torch build."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.onednn, "qlinear_prepack")


def pack(qweight: Tensor) -> Tensor:
    """int8 [N, K] -> oneDNN packed weight (an opaque [K, N] tensor)."""
    return torch.ops.onednn.qlinear_prepack(qweight, None)


def save(packed: Tensor) -> tuple[Tensor, Tensor]:
    """(bytes uint8 [nbytes], serialized memory descriptor uint8) of a packed weight."""
    nbytes = int(torch.ops.mkldnn._nbytes(packed))
    blob = torch.empty(nbytes, dtype=torch.uint8)
    ctypes.memmove(blob.data_ptr(), int(torch.ops.mkldnn.data_ptr(packed)), nbytes)
    return blob, torch.ops.mkldnn._get_mkldnn_serialized_md(packed).clone()


@cache
def _shim() -> tuple[ctypes.CDLL, object, object]:
    lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
    make = lib.aoti_torch_create_tensor_from_blob_v2
    make.restype = ctypes.c_int32
    make.argtypes = [
        ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64),
        ctypes.POINTER(ctypes.c_int64), ctypes.c_int64, ctypes.c_int32, ctypes.c_int32,
        ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int32, ctypes.c_void_p,
        ctypes.c_int64,
    ]
    capsule = ctypes.pythonapi.PyCapsule_New
    capsule.restype = ctypes.py_object
    capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return lib, make, capsule


def restore(blob: Tensor, md: Tensor, shape: tuple[int, int]) -> Tensor:
    """The packed weight of logical shape [K, N] over ``blob`` (kept alive by the caller)."""
    lib, make, capsule = _shim()
    sizes = (ctypes.c_int64 * 2)(*shape)
    strides = (ctypes.c_int64 * 2)(shape[1], 1)
    handle = ctypes.c_void_p()
    err = make(blob.data_ptr(), 2, sizes, strides, 0, lib.aoti_torch_dtype_int8(),
               lib.aoti_torch_device_type_cpu(), 0, ctypes.byref(handle),
               lib.aoti_torch_layout__mkldnn(), md.data_ptr(), md.numel())
    if err or not handle.value:
        raise RuntimeError("could not rebuild a oneDNN packed weight")
    out = torch._C._aoti.alloc_tensor_by_stealing_from_void_ptr(capsule(handle.value, None, None))
    if out.layout != torch._mkldnn or tuple(out.shape) != tuple(shape):
        raise RuntimeError("rebuilt oneDNN weight has the wrong layout")
    return out
