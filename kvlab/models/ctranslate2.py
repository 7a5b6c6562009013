"""Read a CTranslate2 model file (`model.bin`) into numpy arrays, without CTranslate2 itself.

The layout, as CTranslate2's `ModelSpec.save` writes it (binary version 6; little-endian throughout):

    uint32 binary version | string spec name | uint32 spec revision | uint32 variable count
    per variable: string name | uint8 rank | uint32 per dimension | uint8 dtype | uint32 byte count | the bytes
    uint32 alias count | per alias: string alias | string variable name

where a string is a uint16 length (the terminating NUL included), the UTF-8 bytes and a NUL, and dtype is
CTranslate2's `DataType` (0 float32, 1 int8, 2 int16, 3 int32, 4 float16, 5 bfloat16). A scalar (rank 0) is a
model option (`num_heads`, `pre_norm`, ...). This module reads and checks the file; what the variables mean is
the caller's (`kvlab.models.whisper` maps a `WhisperSpec`). It does not quantize or convert.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

SUPPORTED_VERSIONS = (5, 6)
"""The binary versions whose layout is the one above (6 added nothing this reader needs over 5)."""
DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}
"""CTranslate2 `DataType` id -> numpy type (bfloat16, id 5, has no numpy type and is refused)."""


class Ct2FormatError(ValueError):
    """The file is not a CTranslate2 model this reader understands; the message says where it stopped."""


@dataclass
class Ct2Model:
    """A parsed `model.bin`: spec name (`WhisperSpec`), revision, variables by name (read-only numpy arrays
    viewing the file's bytes) and aliases (alias -> the variable it stands for, e.g. a tied output
    projection)."""

    spec: str
    revision: int
    variables: dict[str, np.ndarray]
    aliases: dict[str, str] = field(default_factory=dict)

    def get(self, name: str) -> np.ndarray:
        """Variable `name`, following an alias. Raises KeyError naming the variable."""
        name = self.aliases.get(name, name)
        if name not in self.variables:
            raise KeyError(f"{self.spec} has no variable {name!r}")
        return self.variables[name]

    def option(self, name: str) -> int:
        """A scalar model option (e.g. `encoder/num_heads`) as an int."""
        return int(self.get(name).reshape(()))


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.offset = data, 0

    def unpack(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.offset + size > len(self.data):
            raise Ct2FormatError(f"truncated at byte {self.offset:,}")
        value = struct.unpack_from(fmt, self.data, self.offset)[0]
        self.offset += size
        return value

    def string(self) -> str:
        length = self.unpack("<H")
        raw = self.take(length)
        if not length or raw[-1:] != b"\0":
            raise Ct2FormatError(f"bad string at byte {self.offset - length:,}")
        return raw[:-1].decode("utf-8")

    def take(self, size: int) -> bytes:
        if self.offset + size > len(self.data):
            raise Ct2FormatError(f"truncated at byte {self.offset:,}: {size:,} bytes wanted")
        view = self.data[self.offset:self.offset + size]
        self.offset += size
        return view

    def variable(self) -> tuple[str, np.ndarray]:
        name = self.string()
        shape = [self.unpack("<I") for _ in range(self.unpack("<B"))]
        dtype_id, size = self.unpack("<B"), self.unpack("<I")
        if dtype_id not in DTYPES:
            raise Ct2FormatError(f"variable {name!r} has data type {dtype_id}, which this reader does not take")
        dtype = np.dtype(DTYPES[dtype_id])
        if size != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
            raise Ct2FormatError(f"variable {name!r}: {size:,} bytes do not fit shape {shape} of {dtype}")
        return name, np.frombuffer(self.take(size), dtype=dtype).reshape(shape)


def read_model_bin(path: str | Path) -> Ct2Model:
    """Parse CTranslate2's `model.bin` at `path` (layout in the module docstring).

    Raises:
        Ct2FormatError: an unsupported binary version or data type, a truncated file, trailing bytes, or a
            variable whose byte count does not match its shape.
        OSError: the file cannot be read.
    """
    reader = _Reader(Path(path).read_bytes())
    version = reader.unpack("<I")
    if version not in SUPPORTED_VERSIONS:
        raise Ct2FormatError(f"binary version {version} (this reader takes {', '.join(map(str, SUPPORTED_VERSIONS))})")
    spec, revision = reader.string(), reader.unpack("<I")
    variables = dict(reader.variable() for _ in range(reader.unpack("<I")))
    aliases = {reader.string(): reader.string() for _ in range(reader.unpack("<I"))}
    if reader.offset != len(reader.data):
        raise Ct2FormatError(f"{len(reader.data) - reader.offset:,} bytes after the last alias")
    return Ct2Model(spec, revision, variables, aliases)
