"""embedding vs PyTorch: a GPT-2 sized table (50257 x 1024, float16) and 8192 ids. Forward is a plan-style
prepared launch against F.embedding; backward is GE2's deterministic sorted scatter-add (one binding call)
against aten's embedding_dense_backward. Bytes: forward reads the 8192 rows and writes them (plus ids);
backward writes the whole table gradient (rows no id names are zeros) and reads dy (plus ids)."""
from __future__ import annotations

from graph_executor_v2.ops import embedding as emb
from ._launch import prepared

VOCAB, DIM, COUNT = 50257, 1024, 8192


def cases(torch):
    F = torch.nn.functional
    table = torch.randn(VOCAB, DIM, device="cuda", dtype=torch.float16)
    ids = torch.randint(0, VOCAB, (COUNT,), device="cuda")
    y = torch.empty(COUNT, DIM, device="cuda", dtype=torch.float16)
    forward = prepared("embedding", [table, ids], [y], {})

    def check_forward():
        forward()
        if not torch.equal(y, F.embedding(ids, table)):
            raise AssertionError("embedding forward: GE2 disagrees with F.embedding")

    dy = torch.randn(COUNT, DIM, device="cuda", dtype=torch.float16)
    dtable = torch.empty_like(table)
    native_backward = emb._native_module().backward

    def backward():
        native_backward(dy.data_ptr(), ids.data_ptr(), dtable.data_ptr(), VOCAB, DIM, COUNT, "float16", "int64",
                        False, 0)

    def torch_backward():
        return torch.ops.aten.embedding_dense_backward(dy, ids, VOCAB, -1, False)

    def check_backward():
        backward()
        expected = torch.ops.aten.embedding_dense_backward(dy.float(), ids, VOCAB, -1, False)
        torch.testing.assert_close(dtable.float(), expected, rtol=2e-3, atol=2e-3,
                                   msg=lambda m: f"embedding backward: {m}")

    row_bytes = COUNT * DIM * 2
    return [
        {"name": f"embedding fwd f16 {VOCAB}x{DIM}, {COUNT} ids", "ge2": forward,
         "torch": lambda: F.embedding(ids, table), "check": check_forward, "bytes": 2 * row_bytes + COUNT * 8,
         "target": {"copy_fraction": 0.85}},
        {"name": f"embedding bwd f16 {VOCAB}x{DIM}, {COUNT} ids", "ge2": backward, "torch": torch_backward,
         "check": check_backward, "bytes": VOCAB * DIM * 2 + row_bytes + COUNT * 8,
         "target": {"copy_fraction": 0.70}},
    ]
