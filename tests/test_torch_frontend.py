"""PyTorch import through torch.export: modules compared with their own output on GE2's CPU backend (and on the
GPU backend where there is a GPU). Runs wherever torch is installed (the GPU machine); skips elsewhere."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the torch frontend is an optional extra")

import graph_executor_v2 as ge2  # noqa: E402
from graph_executor_v2.frontend import UnsupportedModelError  # noqa: E402
from graph_executor_v2.frontend.torch import from_torch  # noqa: E402
from graph_executor_v2.testing import assert_close  # noqa: E402


class _Block(torch.nn.Module):
    """A pre-norm transformer MLP block with a residual (what a GPT block is around its attention)."""

    def __init__(self, width=32):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x)), approximate="tanh"))


def _devices():
    return ["cpu"] + (["cuda"] if ge2.is_available() else [])


@pytest.mark.parametrize("device", _devices())
def test_mlp(device):
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10),
                                 torch.nn.LogSoftmax(dim=-1)).eval()
    x = torch.randn(8, 20)
    graph = from_torch(module, (x,))
    out = ge2.ExecutorV2(graph, device=device).run({graph.inputs[0].name: x.numpy()})["y"]
    assert_close(out, module(x).detach().double().numpy(), "float32", reduction_length=64)


@pytest.mark.parametrize("device", _devices())
def test_transformer_block_on_3d_input(device):
    torch.manual_seed(1)
    module = _Block().eval()
    x = torch.randn(2, 5, 32)
    graph = from_torch(module, (x,))
    out = ge2.ExecutorV2(graph, device=device).run({graph.inputs[0].name: x.numpy()})["y"]
    assert_close(out, module(x).detach().double().numpy(), "float32", reduction_length=128)


def test_every_unsupported_aten_op_is_listed():
    class Odd(torch.nn.Module):
        def forward(self, x):
            return torch.sqrt(x) + torch.erf(x)

    with pytest.raises(UnsupportedModelError) as caught:
        from_torch(Odd(), (torch.randn(4),))
    targets = {problem[1] for problem in caught.value.problems}
    assert any("sqrt" in t for t in targets) and any("erf" in t for t in targets), targets


def test_bad_arguments():
    with pytest.raises(TypeError, match="module: expected a torch.nn.Module"):
        from_torch(lambda x: x, (torch.randn(2),))
    with pytest.raises(TypeError, match="example_inputs: expected a tuple"):
        from_torch(torch.nn.ReLU(), torch.randn(2))
