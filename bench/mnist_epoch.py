"""Epoch time of the MNIST input pipelines, side by side on the same digits.

- "torchvision": `torchvision.datasets.MNIST` with `ToTensor()` + `Normalize()`, one PIL
  image per digit, batched by a DataLoader (the textbook pipeline);
- "dataset": our `MnistDataset` (a uint8 tensor, normalised per digit) with a DataLoader;
- "device": our `DeviceBatches` (one normalised tensor on the device, shuffled by index).

Each is timed reading the batches only (moved to the device) and training LeNet-5 on them
(forward, backward, Adam step; no distortions), on the embedded sample's 4,000 training digits
or the IDX files in --data_dir (written into a torchvision layout: all read the same data).
One warm-up epoch each, then the pipelines alternate --repeats times so that other processes'
noise hits all of them; medians and ratios (torchvision = 1) are printed.

    python -m bench.mnist_epoch [--data_dir data/mnist] [--batch_size 32] [--repeats 5]
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import DataLoader
from torchvision import transforms
from torchvision.datasets import MNIST
from transformers.hf_argparser import HfArg

from common.cli import entry_point, parse_args
from mnist.args import MnistArguments
from mnist.data import MNIST_MEAN, MNIST_STD, DeviceBatches, MnistDataset, load_digit_splits
from mnist.experiment import resolve_device
from mnist.idx import write_idx
from mnist.model import LeNet5
from report.tables import markdown_table

PIPELINES = ("torchvision", "dataset", "device")


@dataclass
class EpochBenchArguments:
    data_dir: str | None = HfArg(
        default=None, help="Folder with MNIST IDX files (default: the embedded 5k sample)."
    )
    batch_size: int = HfArg(default=32, help="Digits per batch.")
    repeats: int = HfArg(default=5, help="Timed epochs per pipeline and mode.")
    device: str = HfArg(default="auto", help="auto, cpu or cuda.")
    num_threads: int = HfArg(default=0, help="torch CPU threads (0: torch's default).")


def torchvision_dataset(images: Tensor, labels: Tensor, root: Path) -> MNIST:
    """torchvision's MNIST over our digits: IDX files in its <root>/MNIST/raw/ layout."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for prefix in ("train", "t10k"):  # it checks that both splits exist
        write_idx(raw / f"{prefix}-images-idx3-ubyte", images.numpy())
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels.numpy().astype("uint8"))
    transform = transforms.Compose(
        [transforms.ToTensor(), transforms.Normalize((MNIST_MEAN,), (MNIST_STD,))]
    )
    return MNIST(str(root), train=True, transform=transform)


def build_pipelines(
    images: Tensor, labels: Tensor, root: Path, batch_size: int, device: torch.device
) -> dict[str, Iterable[tuple[Tensor, Tensor]]]:
    def loader(dataset) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=True,
            pin_memory=device.type == "cuda",
            generator=torch.Generator().manual_seed(0),
        )

    return {
        "torchvision": loader(torchvision_dataset(images, labels, root)),
        "dataset": loader(MnistDataset(images, labels)),
        "device": DeviceBatches(images, labels, batch_size, shuffle=True, device=device),
    }


def make_epoch(
    batches: Iterable[tuple[Tensor, Tensor]], device: torch.device, train: bool
) -> Callable[[], None]:
    """One pass over `batches`: only moving them to the device, or also training on them."""
    model = LeNet5().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def epoch() -> None:
        for images, labels in batches:
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            if train:
                loss = F.cross_entropy(model(images), labels)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return epoch


def time_epochs(epochs: dict[str, Callable[[], None]], repeats: int) -> dict[str, float]:
    """Median seconds per epoch; one warm-up each, then the pipelines alternate."""
    for epoch in epochs.values():
        epoch()
    seconds: dict[str, list[float]] = {name: [] for name in epochs}
    for _ in range(repeats):
        for name, epoch in epochs.items():
            start = time.perf_counter()
            epoch()
            seconds[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in seconds.items()}


@entry_point
def main(argv: list[str] | None = None) -> int:
    (args,) = parse_args([EpochBenchArguments], argv, description=__doc__)
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    device = resolve_device(args.device)
    splits = load_digit_splits(MnistArguments(data_dir=args.data_dir, val_fraction=0))
    images, labels = splits.train_images, splits.train_labels
    results = {}
    with tempfile.TemporaryDirectory(prefix="mnist-epoch-") as root:
        pipelines = build_pipelines(images, labels, Path(root), args.batch_size, device)
        for mode, train in (("reading only", False), ("training LeNet-5", True)):
            epochs = {name: make_epoch(pipelines[name], device, train) for name in PIPELINES}
            results[mode] = time_epochs(epochs, args.repeats)

    print(
        f"{len(labels)} digits ({splits.source}), batch {args.batch_size}, device {device}, "
        f"{torch.get_num_threads()} threads, median of {args.repeats} epochs"
    )
    header = ["pipeline"]
    for mode in results:
        header += [f"{mode}: s/epoch", "speed-up"]
    rows = [
        [name, *(f"{r[name]:.3f} | {r['torchvision'] / r[name]:.1f}x" for r in results.values())]
        for name in PIPELINES
    ]
    print("\n".join(markdown_table(header, rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
