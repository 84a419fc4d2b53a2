"""cross_entropy vs PyTorch: the training step of a 32000-class float16 head over 8192 rows. GE2 runs the fused
kernel (loss and dlogits in one pass over the logits, upstream gradient 1) the way a plan calls it: one binding
call on preallocated outputs. PyTorch runs F.cross_entropy and autograd's backward (log_softmax, nll_loss and
their backwards). Bytes: the logits read once and dlogits written once (plus labels), what the fused step must
move."""
from __future__ import annotations

from graph_executor_v2.ops import cross_entropy as ce

ROWS, CLASSES = 8192, 32000


def cases(torch):
    F = torch.nn.functional
    logits = torch.randn(ROWS, CLASSES, device="cuda", dtype=torch.float16) * 3
    labels = torch.randint(0, CLASSES, (ROWS,), device="cuda")
    labels[::50] = -100  # a few ignored rows, as padding would give
    loss = torch.empty((), device="cuda", dtype=torch.float16)
    dlogits = torch.empty_like(logits)
    native_forward = ce._native_module().forward
    pointers = (logits.data_ptr(), labels.data_ptr(), loss.data_ptr(), dlogits.data_ptr())
    kernel = ce._kernel("auto", CLASSES, "float16", logits.data_ptr(), dlogits.data_ptr())  # the selector's choice

    def ge2_step():
        native_forward(*pointers, ROWS, CLASSES, "float16", "int64", "mean", -100, kernel, False, 0)

    leaf = logits.detach().requires_grad_()

    def torch_step():
        return torch.autograd.grad(F.cross_entropy(leaf, labels, ignore_index=-100), leaf)

    def check():
        # the gradient under "sum" (under "mean" float16 flushes most of it to zero), then the timed "mean" step
        native_forward(*pointers, ROWS, CLASSES, "float16", "int64", "sum", -100, kernel, True, 0)
        (expected_grad,) = torch.autograd.grad(F.cross_entropy(leaf.float(), labels, reduction="sum"), leaf)
        torch.testing.assert_close(dlogits.float(), expected_grad.float(), rtol=2e-3, atol=2e-3,
                                   msg=lambda m: f"cross_entropy dlogits (sum): {m}")
        ge2_step()
        expected_loss = F.cross_entropy(logits.float(), labels, ignore_index=-100)
        torch.testing.assert_close(loss.float(), expected_loss, rtol=2e-3, atol=2e-3,
                                   msg=lambda m: f"cross_entropy loss (mean): {m}")

    moved = 2 * ROWS * CLASSES * 2 + ROWS * 8 + 2
    return [{"name": f"cross_entropy fwd+bwd f16 {ROWS}x{CLASSES}", "ge2": ge2_step, "torch": torch_step,
             "check": check, "bytes": moved, "target": {"speedup": 1.5}}]
