"""LeNet-5 (LeCun, Bottou, Bengio, Haffner 1998), read top to bottom.

Layer names follow the paper's roles: C1 -> conv1, S2 -> pool1, C3 -> conv2, S4 -> pool2,
C5 -> fc1, F6 -> fc2, output -> fc3. Three simplifications are the usual modern ones and keep
the classic 61,706 parameters: plain average pooling instead of the trainable subsampling
coefficients, C3 connected to all six S2 maps instead of the paper's partial table, and a
linear output layer with cross-entropy instead of the Euclidean RBF units.
"""

import torch
from torch import Tensor, nn

NUM_CLASSES = 10
# fc2's output: the 84 features the projector shows (the paper's F6).
PENULTIMATE_LAYER = "fc2"
CONV_LAYERS = ("conv1", "conv2")


class LeNet5(nn.Module):
    """LeNet-5 on 28x28 grayscale digits; returns logits (N, num_classes)."""

    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        # The paper feeds 32x32 inputs so that strokes reach the centre of C1's receptive
        # fields; padding the 28x28 MNIST digits by 2 on each side does exactly that.
        self.conv1 = nn.Conv2d(1, 6, kernel_size=5, padding=2)  # C1: 6@28x28
        self.pool1 = nn.AvgPool2d(2)  # S2: 6@14x14
        self.conv2 = nn.Conv2d(6, 16, kernel_size=5)  # C3: 16@10x10
        self.pool2 = nn.AvgPool2d(2)  # S4: 16@5x5
        self.fc1 = nn.Linear(16 * 5 * 5, 120)  # C5: a 5x5 convolution over 5x5 maps = dense
        self.fc2 = nn.Linear(120, 84)  # F6
        self.fc3 = nn.Linear(84, num_classes)  # output

    def forward_with_activations(self, images: Tensor) -> dict[str, Tensor]:
        """Every layer's output by name, in order; the last ("fc3") is the logits."""
        activations = {}
        x = activations["conv1"] = torch.tanh(self.conv1(images))  # (N, 6, 28, 28)
        x = activations["pool1"] = self.pool1(x)  # (N, 6, 14, 14)
        x = activations["conv2"] = torch.tanh(self.conv2(x))  # (N, 16, 10, 10)
        x = activations["pool2"] = self.pool2(x)  # (N, 16, 5, 5)
        x = activations["fc1"] = torch.tanh(self.fc1(x.flatten(1)))  # (N, 120)
        x = activations["fc2"] = torch.tanh(self.fc2(x))  # (N, 84)
        activations["fc3"] = self.fc3(x)  # (N, 10)
        return activations

    def forward(self, images: Tensor) -> Tensor:
        return self.forward_with_activations(images)["fc3"]


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
