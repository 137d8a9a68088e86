"""TensorBoard logging shared by both trainers, so both runs show the same tags.

Scalars are written by the trainers with the tag names of `common.run_contract` (the plain
loop through `SummaryWriter.add_scalar`, Lightning through `self.log`); everything else goes
through the functions here, given the `SummaryWriter` (Lightning's
`TensorBoardLogger.experiment`).
"""

import logging
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.tensorboard import SummaryWriter
from torchvision.utils import make_grid

from common.run_contract import (
    ACTIVATIONS_PREFIX,
    FEATURE_MAPS_PREFIX,
    FILTERS_PREFIX,
    WEIGHTS_PREFIX,
)
from mnist.data import NUM_CLASSES, DigitSplits, normalize_images
from mnist.model import CONV_LAYERS, PENULTIMATE_LAYER, LeNet5

logger = logging.getLogger(__name__)

PROJECTOR_TAG = f"penultimate_{PENULTIMATE_LAYER}"
# Filters are 5x5 and deep feature maps 10x10: enlarged so they are visible at TensorBoard's
# default zoom.
FILTER_ZOOM = 4
FEATURE_MAP_SIZE = 28


def select_probe_images(images: Tensor, labels: Tensor, device: torch.device) -> Tensor:
    """The first digit of each class present in uint8 `images` (N, 28, 28), normalised
    (P, 1, 28, 28) on `device`: the fixed digits whose feature maps we show. A test set may
    lack some digits; they get no row, and the log says so."""
    present = labels.unique().tolist()
    absent = sorted(set(range(NUM_CLASSES)) - set(present))
    if absent:
        logger.info(
            "the test set has no digit %s: the feature maps show one row for each of %s",
            ", ".join(map(str, absent)),
            ", ".join(map(str, present)),
        )
    chosen = torch.stack([torch.nonzero(labels == digit)[0, 0] for digit in present])
    return normalize_images(images[chosen]).to(device)


def feature_map_grid(inputs: Tensor, maps: Tensor) -> Tensor:
    """One row per digit (N, 1, 28, 28): the digit, then each channel's map of `maps`
    (N, C, H, W), each scaled to [0, 1]."""
    num_channels = maps.shape[1]
    maps = F.interpolate(maps, size=FEATURE_MAP_SIZE, mode="nearest")  # (N, C, 28, 28)
    tiles = torch.cat([inputs, maps], dim=1).reshape(-1, 1, FEATURE_MAP_SIZE, FEATURE_MAP_SIZE)
    return make_grid(tiles, nrow=num_channels + 1, normalize=True, scale_each=True, pad_value=1)


def filter_grid(weight: Tensor) -> Tensor:
    """One row per output channel, one tile per input channel: (out, in, k, k) -> image."""
    tiles = F.interpolate(weight.flatten(0, 1)[:, None], scale_factor=FILTER_ZOOM, mode="nearest")
    return make_grid(tiles, nrow=weight.shape[1], normalize=True, scale_each=True, pad_value=1)


@torch.no_grad()
def log_layers(writer: SummaryWriter, model: LeNet5, probe_images: Tensor, step: int) -> None:
    """Feature maps of the probe digits (normalised, on the model's device), conv filters,
    weight and activation histograms."""
    was_training = model.training
    model.eval()
    activations = model.forward_with_activations(probe_images)
    for layer in CONV_LAYERS:
        writer.add_image(
            FEATURE_MAPS_PREFIX + layer, feature_map_grid(probe_images, activations[layer]), step
        )
        writer.add_image(FILTERS_PREFIX + layer, filter_grid(getattr(model, layer).weight), step)
    for name, module in model.named_children():
        if hasattr(module, "weight"):
            writer.add_histogram(WEIGHTS_PREFIX + name, module.weight, step)
    for name, value in activations.items():
        writer.add_histogram(ACTIVATIONS_PREFIX + name, value, step)
    model.train(was_training)


@torch.no_grad()
def log_graph_and_layers(writer: SummaryWriter, model: LeNet5, splits: DigitSplits) -> Tensor:
    """Before training: the traced model graph (GRAPHS tab) and `log_layers` at step 0. Returns
    the probe digits (`select_probe_images` of the test set) for the later `log_layers`."""
    device = next(model.parameters()).device
    probe_images = select_probe_images(splits.test_images, splits.test_labels, device)
    with warnings.catch_warnings():
        # add_graph still relies on torch.jit.trace, which warns that it is deprecated.
        warnings.filterwarnings("ignore", ".*is deprecated.*", FutureWarning)
        writer.add_graph(model, probe_images)
    log_layers(writer, model, probe_images, step=0)
    return probe_images


@torch.no_grad()
def log_embedding(
    writer: SummaryWriter, model: LeNet5, splits: DigitSplits, num_digits: int, step: int
) -> None:
    """Penultimate-layer features of a fixed `num_digits` of the test digits for the PROJECTOR
    tab, with each digit's thumbnail and label."""
    # A fixed random subset, so every class shows up even in label-sorted data.
    order = np.random.default_rng(0).permutation(len(splits.test_labels))[:num_digits]
    chosen = torch.from_numpy(np.sort(order))
    images, labels = splits.test_images[chosen], splits.test_labels[chosen]
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    features = model.forward_with_activations(normalize_images(images.to(device)))
    writer.add_embedding(
        features[PENULTIMATE_LAYER].cpu(),
        metadata=[str(int(label)) for label in labels],
        label_img=images.unsqueeze(1).float().div(255),
        global_step=step,
        tag=PROJECTOR_TAG,
    )
    model.train(was_training)
