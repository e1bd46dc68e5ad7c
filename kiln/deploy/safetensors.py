"""The safetensors format, written and read by kiln itself (no dependency): an 8-byte little-endian
header length, a JSON header naming each tensor's dtype, shape and byte range, then the bytes.
What `kiln.export` writes its weights and a runner's inputs and outputs in; the C++ runner reads
the same format (docs/deploy.md)."""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path

import torch

DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.float16: "F16", torch.bfloat16: "BF16",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
          torch.bool: "BOOL"}
_BY_NAME = {name: dtype for dtype, name in DTYPES.items()}


class SafetensorsError(ValueError):
    """A file that is not valid safetensors (truncated, corrupted, or another format)."""


def save(tensors: dict[str, torch.Tensor], path: str | Path) -> None:
    """Write `tensors` (each stored contiguous) to `path`."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        if t.dtype not in DTYPES:
            raise ValueError(f"safetensors: cannot store {name} of dtype {t.dtype}")
        data = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def load(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of `path`, mapped from the file (read-only memory, copied on write by torch)."""
    data = Path(path).read_bytes() if Path(path).stat().st_size == 0 else None
    with open(path, "rb") as f:
        buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if data is None else data
    if len(buffer) < 8:
        raise SafetensorsError(f"{path}: not a safetensors file (shorter than its header length)")
    (size,) = struct.unpack("<Q", buffer[:8])
    if 8 + size > len(buffer):
        raise SafetensorsError(f"{path}: truncated (its header says {size} bytes, the file has {len(buffer) - 8})")
    try:
        header = json.loads(bytes(buffer[8:8 + size]))
    except ValueError as error:
        raise SafetensorsError(f"{path}: the header is not JSON ({error})") from None
    tensors, start = {}, 8 + size
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        dtype = _BY_NAME.get(entry["dtype"])
        if dtype is None or not 0 <= begin <= end <= len(buffer) - start:
            raise SafetensorsError(f"{path}: tensor {name!r} has dtype {entry['dtype']!r} or bytes outside the file")
        shape = entry["shape"]
        flat = torch.frombuffer(buffer, dtype=torch.uint8, count=end - begin, offset=start + begin) if end > begin \
            else torch.empty(0, dtype=torch.uint8)
        tensors[name] = flat.view(dtype).reshape(shape) if flat.numel() else torch.empty(shape, dtype=dtype)
    return tensors
