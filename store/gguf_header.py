"""A cheap walk of a GGUF header that checks every declared count and length against the file size.

The ``gguf`` package's reader trusts the counts it reads: a 132-byte file that declares an array
of 2^40 items kept it looping while memory grew (15.5 GB after 3 minutes). This walk reads the
same header (GGUF v2/v3: counts and lengths as little-endian uint64) and refuses any count or
length that cannot fit in what is left of the file, before the reader sees it. It costs one pass
over the key-value header and the tensor table through a memory map: ~0.1 s for SmolLM2's
49,152-token vocabulary and its merges; the tensor data is never touched.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

# GGUF value types -> their size in bytes (8: string, 9: array are walked).
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")


class HeaderDamaged(ValueError):
    """A declared count or length does not fit in the file; the text says which."""


class _Walk:
    """A cursor over the mapped file that never reads past its end."""

    def __init__(self, data: mmap.mmap, size: int) -> None:
        self.data, self.size, self.at = data, size, 0

    def need(self, n_bytes: int, what: str) -> None:
        if n_bytes > self.size - self.at:
            raise HeaderDamaged(
                f"{what} at byte {self.at:,} needs {n_bytes:,} bytes, only {self.size - self.at:,} are left"
            )

    def u32(self, what: str) -> int:
        self.need(4, what)
        (value,) = _U32.unpack_from(self.data, self.at)
        self.at += 4
        return int(value)

    def u64(self, what: str) -> int:
        self.need(8, what)
        (value,) = _U64.unpack_from(self.data, self.at)
        self.at += 8
        return int(value)

    def string(self, what: str) -> bytes:
        n_bytes = self.u64(f"the length of {what}")
        self.need(n_bytes, f"{what} (declared {n_bytes:,} bytes long)")
        text = self.data[self.at : self.at + n_bytes]
        self.at += n_bytes
        return text

    def value(self, kind: int, what: str) -> None:
        if kind in _FIXED:
            self.need(_FIXED[kind], what)
            self.at += _FIXED[kind]
        elif kind == _STRING:
            self.string(what)
        elif kind == _ARRAY:
            item = self.u32(f"the item type of {what}")
            count = self.u64(f"the item count of {what}")
            smallest = _FIXED.get(item, 8 if item == _STRING else 12)  # a string or array: its count
            self.need(count * smallest, f"{what} (an array declared with {count:,} items)")
            if item in _FIXED:
                self.at += count * _FIXED[item]
            else:
                for _ in range(count):
                    self.value(item, f"an item of {what}")
        else:
            raise HeaderDamaged(f"{what} at byte {self.at:,} has an unknown value type {kind}")


def check_header(path: Path) -> None:
    """Walk ``path``'s GGUF header and tensor table; every count and length must fit in the file.

    The caller has checked the magic bytes. Versions other than 2 and 3 are left to the reader.

    Raises:
        HeaderDamaged: A count, length or value type that no intact file has (names it and where).
    """
    size = path.stat().st_size
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        walk = _Walk(data, size)
        walk.at = 4
        if walk.u32("the version") not in (2, 3):
            return
        tensors = walk.u64("the tensor count")
        keys = walk.u64("the key-value count")
        walk.need(keys * 13, f"{keys:,} key-value pairs")  # a key's length, a type, a 1-byte value
        for _ in range(keys):
            key = walk.string("a key").decode("utf-8", errors="replace")
            walk.value(walk.u32(f"the type of key {key!r}"), f"the value of key {key!r}")
        walk.need(tensors * 24, f"{tensors:,} tensor descriptions")  # name length, dims, type, offset
        for _ in range(tensors):
            name = walk.string("a tensor name").decode("utf-8", errors="replace")
            dims = walk.u32(f"the dimension count of tensor {name!r}")
            walk.need(dims * 8 + 12, f"tensor {name!r} (declared with {dims:,} dimensions)")
            walk.at += dims * 8 + 12
