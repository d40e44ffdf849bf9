"""A user's own model for the explain check's held-out suite (benchmarks/explain_heldout.yaml): a
plain MLP classifier as someone would write it (784 -> 500 -> 300 -> 10, widths not all multiples
of 8), on synthetic MNIST-sized inputs. Returns (model, make_batch, loss_fn) as python: refs do."""
import itertools

import torch


def mlp(widths=(784, 500, 300, 10)):
    layers = []
    for n_in, n_out in itertools.pairwise(widths):
        layers += [torch.nn.Linear(n_in, n_out), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])

    def make_batch(batch_size, device):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(batch_size, widths[0], generator=g).to(device)
        y = torch.randint(0, widths[-1], (batch_size,), generator=g).to(device)
        return x, y
    return model, make_batch, torch.nn.functional.cross_entropy
