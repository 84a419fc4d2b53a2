"""ResNet-18 on the GPU against PyTorch: the same network in plain torch.nn (``models.resnet.torch_resnet18``:
BasicBlock x [2, 2, 2, 2], the layout and names of torchvision's resnet18, which the GPU machine need not have) and
in ge2.nn (``ge2.models.resnet18``), the same random weights copied over, a batch of 32 images 3x224x224
(``GE2_RESNET_BATCH`` lowers it only where memory forces it), float32 with TF32 off on both sides:

- eval mode: the logits;
- one training step (train-mode batch norm, SGD with momentum, cross-entropy): the loss, every updated parameter
  and every running statistic.

Tolerance: PyTorch's own float32 error. The reference is the same network in float64 (PyTorch on the GPU); GE2's
float32 result must be as close to it as PyTorch's float32 result is, up to a factor (4) and a floor of 1e-5 of the
reference's norm: deep networks compound rounding, so a per-op tolerance would be either loose or flaky.

The CPU part (no torch, no GPU): the ge2.nn ResNet-18 has torchvision's state-dict names and takes a training step
on the CPU backend at a small image size. The GPU tests are named "large": the sanitizer pass of
scripts/gpu_check.sh leaves them out.
"""
from __future__ import annotations

import copy
import os

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2.models import resnet18
from graph_executor_v2.models.resnet import torch_resnet18

BATCH = int(os.environ.get("GE2_RESNET_BATCH", "32"))
IMAGE = 224
LR, MOMENTUM = 0.05, 0.9


def _torchvision_names() -> list[str]:
    """torchvision resnet18's state-dict keys, less the num_batches_tracked counters GE2 has no use for."""
    def conv_bn(prefix, conv, bn):
        return [f"{prefix}{conv}.weight"] + [f"{prefix}{bn}.{n}" for n in ("weight", "bias", "running_mean",
                                                                             "running_var")]

    names = conv_bn("", "conv1", "bn1")
    for stage in range(1, 5):
        for block in range(2):
            prefix = f"layer{stage}.{block}."
            names += conv_bn(prefix, "conv1", "bn1") + conv_bn(prefix, "conv2", "bn2")
            if stage > 1 and block == 0:
                names += conv_bn(prefix, "downsample.0", "downsample.1")
    return names + ["fc.weight", "fc.bias"]


def test_ge2_resnet18_has_torchvisions_names_and_trains_on_the_cpu(rng):
    model = resnet18(num_classes=10)
    assert list(model.state_dict()) == _torchvision_names()
    assert sum(p.data.size for p in model.parameters()) == 11181642  # torchvision's resnet18(num_classes=10)
    graph = model.graph({"x": ((2, 3, 32, 32), "float32"), "labels": ((2,), "int64")})
    trainer = ge2.train.Trainer(graph, optimizer=ge2.train.SGD(lr=LR, momentum=MOMENTUM))
    assert len(trainer.buffer_names) == 40 and len(trainer.trained) == 62
    before = trainer.buffers()
    loss = float(trainer.step({"x": rng.standard_normal((2, 3, 32, 32)).astype(np.float32),
                               "labels": np.array([3, 7])}))
    assert np.isfinite(loss) and 0.5 < loss < 10
    after = trainer.buffers()
    assert all(not np.array_equal(before[name], after[name]) for name in before)


# --- the GPU comparison ------------------------------------------------------------------------------------------
def _relative(error, reference) -> float:
    return float(np.linalg.norm(error) / max(np.linalg.norm(reference), 1e-30))


def _check(what, ge2_value, torch32, torch64, report, typical_error=0.0):
    """GE2's float32 value is as close to the float64 reference as PyTorch's float32 one (factor 4, floor 1e-5), or
    as close as PyTorch's ``typical_error`` where one value's own PyTorch error is luckily smaller."""
    reference = np.asarray(torch64, np.float64)
    ge2_error = _relative(np.asarray(ge2_value, np.float64) - reference, reference)
    torch_error = _relative(np.asarray(torch32, np.float64) - reference, reference)
    report.append(f"{what}: GE2 {ge2_error:.2e}, PyTorch float32 {torch_error:.2e} (relative to float64)")
    assert np.asarray(ge2_value).shape == reference.shape, what
    assert ge2_error <= 4 * max(torch_error, typical_error) + 1e-5, report[-1]


@pytest.fixture
def torch_cuda():
    torch = pytest.importorskip("torch", reason="the comparison needs PyTorch (on the GPU machine)")
    if not torch.cuda.is_available() or not ge2.is_available():
        pytest.skip("needs a CUDA GPU for both PyTorch and GE2")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


def _models(torch, x):
    """(torch float32, torch float64, ge2) with the same weights; the running statistics are those of ``x`` (one
    train-mode pass with momentum 1), so eval mode normalizes activations of the scale it sees."""
    torch.manual_seed(0)
    model32 = torch_resnet18().cuda()
    batch_norms = [m for m in model32.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    with torch.no_grad():
        for norm in batch_norms:
            norm.momentum = 1.0
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.2, 0.2)
        model32.train()(x)
        for norm in batch_norms:
            norm.momentum = 0.1
    model64 = copy.deepcopy(model32).double()
    model = resnet18()
    model.load_state_dict({k: v.detach().cpu().numpy() for k, v in model32.state_dict().items()})
    return model32, model64, model


@pytest.mark.gpu
def test_resnet18_eval_forward_matches_pytorch_large(torch_cuda):
    torch = torch_cuda
    generator = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(BATCH, 3, IMAGE, IMAGE, device="cuda", generator=generator)
    model32, model64, model = _models(torch, x)
    with torch.no_grad():
        expected32 = model32.eval()(x).cpu().numpy()
        expected64 = model64.eval()(x.double()).cpu().numpy()
    graph = model.eval().graph({"x": ((BATCH, 3, IMAGE, IMAGE), "float32")})
    logits = ge2.ExecutorV2(graph, device="cuda", precision="highest").run({"x": x.cpu().numpy()})["logits"]
    report = []
    _check("eval logits", logits, expected32, expected64, report)
    print("\n".join(report))


@pytest.mark.gpu
def test_resnet18_training_step_matches_pytorch_large(torch_cuda):
    torch = torch_cuda
    generator = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randn(BATCH, 3, IMAGE, IMAGE, device="cuda", generator=generator)
    labels = torch.randint(0, 1000, (BATCH,), device="cuda", generator=generator)
    model32, model64, model = _models(torch, x)
    losses = {}
    for name, network, inputs in (("float32", model32, x), ("float64", model64, x.double())):
        network.train()
        optimizer = torch.optim.SGD(network.parameters(), lr=LR, momentum=MOMENTUM)
        loss = torch.nn.functional.cross_entropy(network(inputs), labels)
        loss.backward()
        optimizer.step()
        losses[name] = loss.item()

    graph = model.train().graph({"x": ((BATCH, 3, IMAGE, IMAGE), "float32"), "labels": ((BATCH,), "int64")})
    trainer = ge2.train.Trainer(graph, device="cuda", optimizer=ge2.train.SGD(lr=LR, momentum=MOMENTUM),
                                precision="highest")
    loss = float(trainer.step({"x": x.cpu().numpy(), "labels": labels.cpu().numpy().astype(np.int64)}))
    report = []
    _check("loss", np.array(loss), np.array(losses["float32"]), np.array(losses["float64"]), report)
    state32 = {k: v.detach().cpu().numpy() for k, v in model32.state_dict().items()}
    state64 = {k: v.detach().cpu().numpy() for k, v in model64.state_dict().items()}
    start = {k: v.astype(np.float64) for k, v in model.state_dict().items()}  # the weights before the step
    parameters, buffers = trainer.parameters(), trainer.buffers()
    assert set(parameters) | set(buffers) == set(start)
    # The update (-lr * momentum-SGD's first step = -lr * grad), where rounding shows. A ReLU mask or max-pool
    # winner flips where float32 rounding crosses zero or a tie, at random in PyTorch's float32 as in GE2's, and one
    # flip moves a layer's update by ~1e-3 (seen on the H100: layer4.1.conv2.weight 1.9e-3 off in GE2 where
    # PyTorch's float32 was 9e-6 off by luck, with batch_norm and conv2d backward each 1e-7 off on the same exact
    # inputs). So each update may be as far off as PyTorch's median update error over the network.
    updates = {name: (parameters[name] - start[name], state32[name] - start[name], state64[name] - start[name])
               for name in parameters}
    typical_error = float(np.median([_relative(torch32 - torch64, torch64)
                                     for _, torch32, torch64 in updates.values()]))
    for name, (ge2_update, torch32_update, torch64_update) in updates.items():
        _check(f"update of {name}", ge2_update, torch32_update, torch64_update, report, typical_error)
    for name in buffers:
        _check(name, buffers[name], state32[name], state64[name], report)
    print("\n".join(report))


@pytest.mark.gpu
def test_resnet18_exported_to_onnx_matches_pytorch_large(torch_cuda, tmp_path):
    """The eval-mode network through torch.onnx.export (generated here, not committed) and GE2's ONNX import, on
    the GPU: Conv, BatchNormalization, MaxPool, GlobalAveragePool, Gemm as the exporter writes them."""
    torch = torch_cuda
    from graph_executor_v2.frontend import onnx as onnx_frontend

    generator = torch.Generator(device="cuda").manual_seed(3)
    batch = min(BATCH, 8)
    x = torch.randn(batch, 3, IMAGE, IMAGE, device="cuda", generator=generator)
    model32, model64, _ = _models(torch, x)
    path = tmp_path / "resnet18.onnx"
    try:
        torch.onnx.export(copy.deepcopy(model32).cpu().eval(), (x.cpu(),), str(path), input_names=["x"],
                          output_names=["y"])
    except ModuleNotFoundError as error:  # the dynamo exporter needs onnxscript
        pytest.skip(f"torch.onnx.export needs {error.name}")
    with torch.no_grad():
        expected32 = model32.eval()(x).cpu().numpy()
        expected64 = model64.eval()(x.double()).cpu().numpy()
    graph = onnx_frontend.load(str(path))
    assert graph.op_counts().get("conv2d") == 20, graph.op_counts()
    out = ge2.ExecutorV2(graph, device="cuda", precision="highest").run({graph.inputs[0].name: x.cpu().numpy()})
    report = []
    _check("ONNX import, eval logits", next(iter(out.values())), expected32, expected64, report)
    print("\n".join(report))
