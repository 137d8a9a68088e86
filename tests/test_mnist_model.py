"""LeNet-5: the paper's layer shapes, the classic parameter count, the activations we visualise."""

import torch
import torch.nn.functional as F

from mnist.model import CONV_LAYERS, PENULTIMATE_LAYER, LeNet5, count_parameters


def test_parameter_count_is_the_classic_61706():
    model = LeNet5()
    # conv1 6*(25+1) + conv2 16*(6*25+1) + fc1 120*(400+1) + fc2 84*(120+1) + fc3 10*(84+1)
    assert count_parameters(model) == 156 + 2416 + 48120 + 10164 + 850 == 61706


def test_layer_shapes_follow_the_paper():
    model = LeNet5()
    activations = model.forward_with_activations(torch.randn(3, 1, 28, 28))
    shapes = {name: tuple(value.shape) for name, value in activations.items()}
    assert shapes == {
        "conv1": (3, 6, 28, 28),  # C1 on the 32x32 padded digit
        "pool1": (3, 6, 14, 14),  # S2
        "conv2": (3, 16, 10, 10),  # C3
        "pool2": (3, 16, 5, 5),  # S4
        "fc1": (3, 120),  # C5
        "fc2": (3, 84),  # F6
        "fc3": (3, 10),  # output
    }
    assert list(activations) == [name for name, _ in model.named_children()]
    assert set(CONV_LAYERS) <= set(activations) and PENULTIMATE_LAYER == "fc2"


def test_forward_is_the_last_activation_and_learns():
    torch.manual_seed(0)
    model = LeNet5()
    images, labels = torch.randn(8, 1, 28, 28), torch.arange(8) % 10
    torch.testing.assert_close(model(images), model.forward_with_activations(images)["fc3"])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(20):
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(p.grad is not None for p in model.parameters())
    assert losses[-1] < 0.1 * losses[0]  # it can memorise eight digits
