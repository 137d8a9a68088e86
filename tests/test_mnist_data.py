"""MNIST inputs: the IDX reader on files written byte by byte, every bad-input case through the
trainer's main(), the file layouts users have, the embedded sample and both batchers."""

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from mnist.args import MnistArguments
from mnist.data import (
    MNIST_MEAN,
    MNIST_STD,
    DeviceBatches,
    MnistDataset,
    distort_images,
    find_idx_files,
    load_digit_splits,
    load_sample_digits,
    normalize_images,
    split_per_class,
)
from mnist.idx import IMAGES_MAGIC, LABELS_MAGIC, read_idx, read_images_and_labels, write_idx
from mnist.train import main as train_main

NUM_DIGITS = 20


def idx_bytes(magic: int, shape: tuple[int, ...], payload: bytes) -> bytes:
    """An IDX file built by hand: big-endian magic, then one big-endian uint32 per dimension."""
    return struct.pack(">I", magic) + struct.pack(f">{len(shape)}I", *shape) + payload


def tiny_digits(num_digits: int = NUM_DIGITS) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, size=(num_digits, 28, 28), dtype=np.uint8)
    labels = (np.arange(num_digits) % 10).astype(np.uint8)
    return images, labels


def write_split(folder: Path, names: tuple[str, str], compress: bool = False) -> None:
    """Images and labels files built with struct, gzip-compressed when asked."""
    images, labels = tiny_digits()
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in (
        (names[0], idx_bytes(IMAGES_MAGIC, images.shape, images.tobytes())),
        (names[1], idx_bytes(LABELS_MAGIC, labels.shape, labels.tobytes())),
    ):
        (folder / name).write_bytes(gzip.compress(data) if compress else data)


LECUN_NAMES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def write_lecun_layout(folder: Path, compress: bool = False, dotted: bool = False) -> None:
    for names in LECUN_NAMES.values():
        if dotted:  # train-images.idx3-ubyte, as some unpackers write it
            names = tuple(name.replace("-idx", ".idx") for name in names)
        if compress:
            names = tuple(name + ".gz" for name in names)
        write_split(folder, names, compress)


# ---------------------------------------------------------------- IDX round trip


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
def test_idx_written_with_struct_reads_back(tmp_path, compress):
    write_split(tmp_path, ("images", "labels"), compress)  # no .gz suffix: content decides
    images, labels = read_images_and_labels(tmp_path / "images", tmp_path / "labels")
    expected_images, expected_labels = tiny_digits()
    assert images.dtype == np.uint8 and images.shape == (NUM_DIGITS, 28, 28)
    np.testing.assert_array_equal(images, expected_images)
    np.testing.assert_array_equal(labels, expected_labels)


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
def test_write_idx_matches_the_format_byte_for_byte(tmp_path, compress):
    images, labels = tiny_digits()
    write_idx(tmp_path / "images.gz", images, compress=compress)
    write_idx(tmp_path / "labels", labels, compress=compress)
    data = (tmp_path / "images.gz").read_bytes()
    assert (data[:2] == b"\x1f\x8b") == compress
    raw = gzip.decompress(data) if compress else data
    assert raw == idx_bytes(IMAGES_MAGIC, images.shape, images.tobytes())
    np.testing.assert_array_equal(read_idx(tmp_path / "labels", LABELS_MAGIC), labels)


# ---------------------------------------------------------------- bad input: exit 2, one line


def damage(path: Path, case: str) -> None:
    images, labels = tiny_digits()
    payload = images.tobytes()
    data = {
        "wrong_magic": idx_bytes(0x00000C03, images.shape, payload),  # type 0x0C = int32
        "labels_as_images": idx_bytes(LABELS_MAGIC, labels.shape, labels.tobytes()),
        "truncated_payload": idx_bytes(IMAGES_MAGIC, images.shape, payload[:-100]),
        "truncated_header": struct.pack(">II", IMAGES_MAGIC, NUM_DIGITS),
        "trailing_bytes": idx_bytes(IMAGES_MAGIC, images.shape, payload + b"\0" * 7),
        "wrong_dims": idx_bytes(
            IMAGES_MAGIC, (NUM_DIGITS, 27, 28), payload[: NUM_DIGITS * 27 * 28]
        ),
        "count_mismatch": idx_bytes(IMAGES_MAGIC, (NUM_DIGITS - 1, 28, 28), payload[: -28 * 28]),
        "damaged_gzip": gzip.compress(idx_bytes(IMAGES_MAGIC, images.shape, payload))[:200],
        "empty": b"",
    }[case]
    path.write_bytes(data)


BAD_CASES = {
    "wrong_magic": "has magic number 3075",
    "labels_as_images": "it is an MNIST labels file",
    "truncated_payload": "is truncated",
    "truncated_header": "shorter than its 16-byte header",
    "trailing_bytes": "7 bytes after",
    "wrong_dims": "27x28 pixels",
    "count_mismatch": f"holds {NUM_DIGITS - 1} images but",
    "damaged_gzip": "damaged gzip file",
    "empty": "only 0 bytes",
}


def run_main(argv: list[str], capsys) -> tuple[int, list[str]]:
    code = train_main(argv)
    captured = capsys.readouterr()
    return code, [line for line in captured.err.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_bad_idx_file_is_one_line_naming_file_and_problem(tmp_path, capsys, case):
    write_lecun_layout(tmp_path / "mnist")
    bad_file = tmp_path / "mnist" / "t10k-images-idx3-ubyte"
    damage(bad_file, case)
    output_dir = tmp_path / "run"
    code, errors = run_main(
        ["--data_dir", str(tmp_path / "mnist"), "--output_dir", str(output_dir)], capsys
    )
    assert code == 2
    assert len(errors) == 1 and "\n" not in errors[0]
    assert str(bad_file) in errors[0]
    assert BAD_CASES[case] in errors[0]
    assert not output_dir.exists()  # nothing half-written


def test_label_out_of_range_is_rejected(tmp_path, capsys):
    write_lecun_layout(tmp_path)
    labels_file = tmp_path / "train-labels-idx1-ubyte"
    labels = np.full(NUM_DIGITS, 11, dtype=np.uint8)
    labels_file.write_bytes(idx_bytes(LABELS_MAGIC, labels.shape, labels.tobytes()))
    code, errors = run_main(
        ["--data_dir", str(tmp_path), "--output_dir", str(tmp_path / "r")], capsys
    )
    assert code == 2 and str(labels_file) in errors[0] and "label 11" in errors[0]


def test_missing_files_say_where_we_looked_and_how_to_fix(tmp_path, capsys):
    write_split(tmp_path, LECUN_NAMES["train"])  # test files absent
    code, errors = run_main(
        ["--data_dir", str(tmp_path), "--output_dir", str(tmp_path / "r")], capsys
    )
    assert code == 2 and len(errors) == 1
    message = errors[0]
    assert "t10k-images-idx3-ubyte[.gz]" in message and "t10k-labels-idx1-ubyte[.gz]" in message
    assert "train-images" not in message
    assert str(tmp_path / "MNIST" / "raw") in message
    assert "--data_dir" in message and "--download" in message


def test_data_dir_that_is_no_folder_is_named(tmp_path, capsys):
    missing = tmp_path / "mnist"
    code, errors = run_main(["--data_dir", str(missing), "--output_dir", str(tmp_path)], capsys)
    assert code == 2 and f"--data_dir {missing} is not a folder" in errors[0]


def test_missing_explicit_path_is_named(tmp_path, capsys):
    missing = tmp_path / "nope-idx3-ubyte"
    code, errors = run_main(["--train_images", str(missing), "--output_dir", str(tmp_path)], capsys)
    assert code == 2 and f"--train_images {missing} does not exist" in errors[0]


def test_download_without_network_is_one_clear_line(tmp_path, capsys, monkeypatch):
    # A proxy on a closed local port: torchvision's real download fails as it does offline,
    # without this test reaching any other machine.
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    code, errors = run_main(
        ["--data_dir", str(tmp_path), "--download", "true", "--output_dir", str(tmp_path / "r")],
        capsys,
    )
    assert code == 2 and len(errors) == 1
    assert "could not download MNIST" in errors[0] and "--data_dir" in errors[0]


# ---------------------------------------------------------------- finding files


@pytest.mark.parametrize(
    "layout",
    ["lecun", "lecun_gz", "dotted", "torchvision_raw", "torchvision_raw_gz"],
)
def test_idx_files_found_in_the_layouts_users_have(tmp_path, layout):
    folder = tmp_path / "MNIST" / "raw" if layout.startswith("torchvision") else tmp_path
    write_lecun_layout(folder, compress=layout.endswith("gz"), dotted=layout == "dotted")
    splits = load_digit_splits(MnistArguments(data_dir=str(tmp_path), val_fraction=0.5))
    # The tiny files hold the same digits in both splits, and say so.
    assert splits.sizes == {
        "num_train": 10,
        "num_val": 10,
        "num_test": NUM_DIGITS,
        "num_test_in_train": NUM_DIGITS,
    }
    expected_images, expected_labels = tiny_digits()
    np.testing.assert_array_equal(splits.test_images.numpy(), expected_images)
    np.testing.assert_array_equal(splits.test_labels.numpy(), expected_labels)


def test_explicit_paths_override_the_folder(tmp_path):
    write_lecun_layout(tmp_path / "a")
    write_split(tmp_path / "b", ("my-test-images", "my-test-labels"), compress=True)
    args = MnistArguments(
        data_dir=str(tmp_path / "a"),
        test_images=str(tmp_path / "b" / "my-test-images"),
        test_labels=str(tmp_path / "b" / "my-test-labels"),
    )
    found, missing = find_idx_files(args)
    assert not missing
    assert found["test_images"] == tmp_path / "b" / "my-test-images"
    assert found["train_images"] == tmp_path / "a" / "train-images-idx3-ubyte"


# ---------------------------------------------------------------- the embedded sample


def test_sample_is_5000_real_digits_500_per_class():
    images, labels = load_sample_digits()
    assert images.shape == (5000, 28, 28) and images.dtype == np.uint8
    assert np.bincount(labels).tolist() == [500] * 10
    # Real digits: dark background, bright strokes in the middle.
    assert images[:, :3, :].mean() < 5 and images[:, 10:18, 10:18].mean() > 60


def test_sample_split_is_per_class_deterministic_and_disjoint():
    splits = load_digit_splits(MnistArguments(data_source="sample", val_fraction=0.1))
    again = load_digit_splits(MnistArguments(data_source="sample", val_fraction=0.1, seed=7))
    assert splits.sizes == {
        "num_train": 3600,
        "num_val": 400,
        "num_test": 1000,
        "num_test_in_train": 0,
    }
    assert torch.bincount(splits.test_labels).tolist() == [100] * 10
    assert torch.bincount(splits.val_labels).tolist() == [40] * 10
    assert torch.equal(splits.test_images, again.test_images)  # the seed never moves digits
    flat = lambda t: {bytes(row) for row in t.reshape(len(t), -1).numpy()}  # noqa: E731
    assert not flat(splits.test_images) & flat(splits.train_images)
    assert not flat(splits.val_images) & flat(splits.train_images)


def test_split_per_class_holds_out_each_class_share():
    labels = np.repeat(np.arange(10), 30)
    kept, held = split_per_class(labels, 0.2)
    assert np.bincount(labels[held]).tolist() == [6] * 10
    assert sorted(np.concatenate([kept, held]).tolist()) == list(range(300))


# ---------------------------------------------------------------- batching


def test_dataset_and_device_batches_give_the_same_normalised_digits():
    images, labels = (torch.from_numpy(a) for a in tiny_digits())
    labels = labels.long()
    dataset = MnistDataset(images, labels)
    image, label = dataset[3]
    assert image.shape == (1, 28, 28) and label == 3
    torch.testing.assert_close(image[0], (images[3].float() / 255 - MNIST_MEAN) / MNIST_STD)

    batches = DeviceBatches(images, labels, batch_size=6, shuffle=True, seed=0)
    assert len(batches) == 4
    first = list(batches)
    second = list(batches)
    seen = torch.cat([batch_labels for _, batch_labels in first])
    assert sorted(seen.tolist()) == sorted(labels.tolist())  # every digit once per pass
    order = [torch.cat([x for x, _ in epoch]) for epoch in (first, second)]
    assert not torch.equal(order[0], order[1])  # reshuffled each pass
    x, y = first[0]
    for image, label in zip(x, y, strict=True):
        index = next(i for i in range(len(dataset)) if torch.equal(dataset[i][0], image))
        assert dataset[index][1] == int(label)


def test_distortions_move_strokes_but_keep_shape_and_background():
    images, _ = load_sample_digits()
    digits = normalize_images(torch.from_numpy(images[:64]))
    distorted = distort_images(digits, torch.Generator().manual_seed(0))
    assert distorted.shape == digits.shape
    background = (0 - MNIST_MEAN) / MNIST_STD
    corners = distorted[:, :, :2, :2]
    torch.testing.assert_close(corners, torch.full_like(corners, background), atol=1e-4, rtol=0)
    assert (distorted - digits).abs().mean() > 0.05
    # Ink is moved, not created or lost: total brightness stays within a few percent.
    ink = lambda x: (x - background).sum(dim=(1, 2, 3))  # noqa: E731
    assert torch.allclose(ink(distorted), ink(digits), rtol=0.25)
