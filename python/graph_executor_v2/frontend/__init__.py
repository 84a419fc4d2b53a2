"""Model import: ``frontend.onnx.load`` (ONNX models, and GE2 as an ONNX backend in ``frontend.onnx_backend``) and
``frontend.torch.from_torch`` (PyTorch modules through ``torch.export``). Each needs its own optional package
(``onnx``, ``torch``) only when imported."""
from ._errors import UnsupportedModelError

__all__ = ["UnsupportedModelError"]
