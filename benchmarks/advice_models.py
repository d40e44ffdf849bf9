"""Users' own models for advice's scoring suites (benchmarks/advice_*.yaml): a small CNN as someone would write
it, with channel counts that are not multiples of 8 (30/60/100), on synthetic 10-class images. Returns
(model, make_batch, loss_fn) as python: refs do."""
import torch


def user_cnn(channels=(30, 60, 100), classes=10, downsample="maxpool"):
    """Stages of two 3x3 convolutions, each with a batch norm and a ReLU, downsampled by a max-pool after the
    stage or (`downsample: stride`) by the stage's first convolution at stride 2."""
    layers, width = [], 3
    for out in channels:
        stride = 2 if downsample == "stride" else 1
        layers += [torch.nn.Conv2d(width, out, 3, stride=stride, padding=1, bias=False), torch.nn.BatchNorm2d(out),
                   torch.nn.ReLU(inplace=True), torch.nn.Conv2d(out, out, 3, padding=1, bias=False),
                   torch.nn.BatchNorm2d(out), torch.nn.ReLU(inplace=True)]
        layers += [torch.nn.MaxPool2d(2)] if downsample == "maxpool" else []
        width = out
    model = torch.nn.Sequential(*layers, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                torch.nn.Linear(width, classes))

    def make_batch(batch_size, device, image_size=128):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(batch_size, 3, image_size, image_size, generator=g).to(device)
        y = torch.randint(0, classes, (batch_size,), generator=g).to(device)
        return x, y
    return model, make_batch, torch.nn.functional.cross_entropy


class MixedPrecisionMLP(torch.nn.Module):
    """An MLP of `blocks` blocks (a linear, then a norm and a GELU) over `tokens` positions, whose blocks a user
    wrote in one of the two ways that cast more than autocast itself does: `island` runs each block's norm and
    GELU in fp32 between autocast regions (activations cast up, then back down by the next linear); `loop`
    applies the first block's linear `loop` times in a nested autocast region with its weight cache off (the
    weight cast again at every call). Neither: autocast's own casts alone (the casts rule's silent case)."""

    def __init__(self, width=64, blocks=4, island=False, loop=0):
        super().__init__()
        self.island, self.loop = island, loop
        self.inp, self.out = torch.nn.Linear(64, width), torch.nn.Linear(width, 10)
        self.linears = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(blocks))
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(width) for _ in range(blocks))

    def forward(self, x):
        x = torch.relu(self.inp(x))
        if self.loop:
            with torch.autocast(x.device.type, dtype=torch.bfloat16, cache_enabled=False):
                for _ in range(self.loop):
                    x = torch.relu(self.linears[0](x))
        for linear, norm in zip(self.linears, self.norms, strict=True):
            x = linear(x)
            if self.island:
                with torch.autocast(x.device.type, enabled=False):
                    x = torch.nn.functional.gelu(norm(x.float()))
            else:
                x = torch.nn.functional.gelu(norm(x))
        return self.out(x).mean(1)


def mixed_mlp(island=False, loop=0, tokens=256, width=64):
    model = MixedPrecisionMLP(width, island=island, loop=loop)

    def make_batch(batch_size, device):
        g = torch.Generator().manual_seed(0)
        return (torch.randn(batch_size, tokens, 64, generator=g).to(device),
                torch.randint(0, 10, (batch_size,), generator=g).to(device))
    return model, make_batch, torch.nn.functional.cross_entropy
