"""The IDX file format of MNIST: strict reading and writing.

An IDX file is a 4-byte magic `00 00 <type> <ndim>`, then `ndim` big-endian uint32 sizes, then
the row-major payload. MNIST uses type 0x08 (uint8): images have magic 2051 (N x 28 x 28),
labels 2049 (N). Files may be gzip-compressed; we tell by the first two bytes (1f 8b), not by
the file name, because renamed and half-unpacked downloads are common.
"""

import gzip
import struct
import zlib
from pathlib import Path

import numpy as np

from common.cli import InputError

IMAGES_MAGIC = 2051
LABELS_MAGIC = 2049
IMAGE_SIZE = 28


def read_idx_bytes(path: Path) -> bytes:
    """The file's uncompressed bytes, gunzipped when its content starts with the gzip magic."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise InputError(f"cannot read {path}: {err.strerror}") from None
    if data[:2] != b"\x1f\x8b":
        return data
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as err:
        raise InputError(
            f"{path} is a damaged gzip file ({err}); download it again or pass the unpacked file"
        ) from None


def read_idx(path: str | Path, expected_magic: int) -> np.ndarray:
    """Read one uint8 IDX file, checking magic, header and exact payload length."""
    path = Path(path)
    data = read_idx_bytes(path)
    kind = "images" if expected_magic == IMAGES_MAGIC else "labels"
    if len(data) < 4:
        raise InputError(f"{path} is not an IDX file: only {len(data)} bytes, no header")
    (magic,) = struct.unpack(">I", data[:4])
    if magic != expected_magic:
        swapped = {IMAGES_MAGIC: "an MNIST images file", LABELS_MAGIC: "an MNIST labels file"}
        hint = f"it is {swapped[magic]}" if magic in swapped else "is it the right file?"
        raise InputError(
            f"{path} has magic number {magic} (0x{magic:08x}), expected {expected_magic} "
            f"(0x{expected_magic:08x}) for MNIST {kind}; {hint}"
        )
    ndim = magic & 0xFF
    header_size = 4 + 4 * ndim
    if len(data) < header_size:
        raise InputError(
            f"{path} is truncated: {len(data)} bytes, shorter than its {header_size}-byte header"
        )
    shape = struct.unpack(f">{ndim}I", data[4:header_size])
    payload_size = int(np.prod(shape, dtype=np.int64))
    actual_payload = len(data) - header_size
    if actual_payload < payload_size:
        raise InputError(
            f"{path} is truncated: header says shape {tuple(shape)} = {payload_size} bytes of "
            f"data, file has {actual_payload}; download it again"
        )
    if actual_payload > payload_size:
        raise InputError(
            f"{path} has {actual_payload - payload_size} bytes after the {payload_size} bytes "
            f"its header {tuple(shape)} announces; the file is damaged or not MNIST"
        )
    if kind == "images" and tuple(shape[1:]) != (IMAGE_SIZE, IMAGE_SIZE):
        raise InputError(
            f"{path} holds images of {shape[1]}x{shape[2]} pixels, expected "
            f"{IMAGE_SIZE}x{IMAGE_SIZE} for MNIST"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=header_size).reshape(shape)


def read_images_and_labels(
    images_path: str | Path, labels_path: str | Path
) -> tuple[np.ndarray, np.ndarray]:
    """Read a matching pair of IDX files: uint8 images (N, 28, 28) and labels (N,) in 0..9."""
    images = read_idx(images_path, IMAGES_MAGIC)
    labels = read_idx(labels_path, LABELS_MAGIC)
    if len(images) != len(labels):
        raise InputError(
            f"{images_path} holds {len(images)} images but {labels_path} holds {len(labels)} "
            f"labels; the two files must come from the same split"
        )
    if labels.size and labels.max() > 9:
        raise InputError(f"{labels_path} holds label {labels.max()}; MNIST labels are 0..9")
    return images, labels


def write_idx(path: str | Path, array: np.ndarray, compress: bool = False) -> None:
    """Write a uint8 array as an IDX file (gzip-compressed when `compress`)."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = struct.pack(">I", (0x08 << 8) | array.ndim)  # type 0x08: uint8
    header += struct.pack(f">{array.ndim}I", *array.shape)
    data = header + array.tobytes()
    Path(path).write_bytes(gzip.compress(data) if compress else data)
