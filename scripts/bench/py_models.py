"""The mltrain registry's models in PyTorch, for the Python baselines (py_train.py on CPU,
py_train_cuda.py on a GPU). Same layers and the same op order as lib/src/model/model.cpp
(ReLU after max-pooling: equal values, 4x fewer elements), so timings compare like with like.
`Linear` lets the CPU expert baseline swap in its oneDNN-sgemm Linear."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):  # configs/fashion_mnist_mlp.yaml
    def __init__(self, Linear=nn.Linear):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), Linear(784, 512), nn.ReLU(), nn.Dropout(0.1), Linear(512, 256), nn.ReLU(),
                                  nn.Dropout(0.1), Linear(256, 10))

    def forward(self, x):
        return self.body(x)


class CNN(nn.Module):  # configs/fashion_mnist_cnn.yaml
    def __init__(self, Linear=nn.Linear):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 5, padding=2, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2, bias=False)
        self.bn2 = nn.BatchNorm2d(64)
        self.fc1 = Linear(64 * 7 * 7, 256)
        self.fc2 = Linear(256, 10)
        self.drop = nn.Dropout(0.25)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.bn1(self.conv1(x)), 2))
        x = F.relu(F.max_pool2d(self.bn2(self.conv2(x)), 2))
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(self.drop(x))


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (self.short(x) if self.short is not None else x))


class ResNet(nn.Module):  # configs/fashion_mnist_resnet_recipe.yaml: widths [32, 64, 128], depths [1, 1, 1]
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 32, 3, padding=1, bias=False)
        self.stem_bn = nn.BatchNorm2d(32)
        self.stages = nn.Sequential(Block(32, 32, 1), Block(32, 64, 2), Block(64, 128, 2))
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.stem_bn(self.stem(x)))
        x = self.stages(x)
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


class ExamplesCNN(nn.Module):  # pytorch/examples' mnist/main.py Net: mltrain trains it as TorchScript
    def __init__(self, Linear=nn.Linear):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = Linear(9216, 128)
        self.fc2 = Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = self.fc1(torch.flatten(self.dropout1(x), 1))
        x = self.fc2(self.dropout2(F.relu(x)))
        return F.log_softmax(x, dim=1)
