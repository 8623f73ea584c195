"""Moving a CRIU image's user namespace to another uid range, so the image restores into another sandbox (a fork).

The image names the sandbox's host ids in one place only: the uid and gid maps of its user namespace
(`userns-<id>.img`). Credentials, file owners and everything else in it are counted inside the namespace. So
restoring another sandbox's image in a slot of its own takes that map moved to the slot's range, and the
writable layer's owners moved the same way (`shift_ids`).

The file is CRIU's image format (`criu/include/magic.h`, `images/userns.proto`): two 32-bit magics, then one
entry, a 32-bit little-endian size and a protobuf `UsernsEntry { repeated UidGidExtent uid_map = 1; repeated
UidGidExtent gid_map = 2; }` with `UidGidExtent { uint32 first = 1; uint32 lower_first = 2; uint32 count = 3; }`.
Two messages of three integers each do not justify a protobuf dependency: they are read and written here.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from pool._errors import RuntimeFailure
from pool._local._userns import IDS_PER_SANDBOX

__all__ = ["move_user_namespace"]

_HEADER = 8  # the common magic and USERNS_MAGIC
_SIZE = struct.Struct("<I")
_LENGTH_DELIMITED, _VARINT = 2, 0
_MAPS = (1, 2)  # uid_map, gid_map
_FIRST, _LOWER_FIRST, _COUNT = 1, 2, 3


def move_user_namespace(images: Path, base: int, to: int) -> None:
    """Rewrite every user namespace of the CRIU image in `images` so that what mapped to host ids `base`.. maps to
    `to`.. (a new file each: other forks may hard-link the old one). RuntimeFailure when there is none or a map
    points outside the sandbox's range."""
    found = sorted(images.glob("userns-*.img"))
    if not found:
        raise RuntimeFailure(f"the image in {images} has no user namespace")
    for path in found:
        data = path.read_bytes()
        try:
            (size,) = _SIZE.unpack_from(data, _HEADER)
            start = _HEADER + _SIZE.size
            maps = _decode_entry(data[start : start + size])
        except (struct.error, ValueError) as exc:
            raise RuntimeFailure(f"{path} cannot be read: {exc}") from exc
        moved = {field: [_moved(extent, base, to, path) for extent in extents] for field, extents in maps.items()}
        entry = _encode_entry(moved)
        staged = path.with_suffix(".new")
        staged.write_bytes(data[:_HEADER] + _SIZE.pack(len(entry)) + entry)
        os.replace(staged, path)


def _moved(extent: tuple[int, int, int], base: int, to: int, path: Path) -> tuple[int, int, int]:
    first, lower_first, count = extent
    if not (base <= lower_first and lower_first + count <= base + IDS_PER_SANDBOX):
        raise RuntimeFailure(f"{path} maps ids outside the sandbox's range {base}..: {extent}")
    return first, lower_first - base + to, count


def _decode_entry(message: bytes) -> dict[int, list[tuple[int, int, int]]]:
    maps: dict[int, list[tuple[int, int, int]]] = {field: [] for field in _MAPS}
    for field, wire, value in _fields(message):
        if field not in _MAPS or wire != _LENGTH_DELIMITED or not isinstance(value, bytes):
            raise ValueError(f"unexpected field {field} (wire type {wire}) in a UsernsEntry")
        numbers = {number: int(v) for number, kind, v in _fields(value) if kind == _VARINT and isinstance(v, int)}
        if set(numbers) != {_FIRST, _LOWER_FIRST, _COUNT}:
            raise ValueError(f"an incomplete UidGidExtent: {numbers}")
        maps[field].append((numbers[_FIRST], numbers[_LOWER_FIRST], numbers[_COUNT]))
    return maps


def _encode_entry(maps: dict[int, list[tuple[int, int, int]]]) -> bytes:
    out = bytearray()
    for field in _MAPS:
        for extent in maps[field]:
            body = b"".join(_varint(number << 3 | _VARINT) + _varint(value) for number, value in enumerate(extent, 1))
            out += _varint(field << 3 | _LENGTH_DELIMITED) + _varint(len(body)) + body
    return bytes(out)


def _fields(message: bytes) -> list[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of a protobuf message holding only varints and length-delimited fields."""
    fields: list[tuple[int, int, int | bytes]] = []
    at = 0
    while at < len(message):
        key, at = _read_varint(message, at)
        field, wire = key >> 3, key & 7
        if wire == _VARINT:
            value, at = _read_varint(message, at)
            fields.append((field, wire, value))
        elif wire == _LENGTH_DELIMITED:
            length, at = _read_varint(message, at)
            if at + length > len(message):
                raise ValueError("a field runs past the end of its message")
            fields.append((field, wire, message[at : at + length]))
            at += length
        else:
            raise ValueError(f"wire type {wire} is not expected here")
    return fields


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("a truncated varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)
