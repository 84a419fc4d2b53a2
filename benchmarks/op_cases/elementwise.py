"""elementwise vs PyTorch: float16, 64M elements (8192 x 8192). GE2 runs as a plan would: prepared candidate
launches (forward) and the native backward, one binding call each, on preallocated outputs. PyTorch runs what
its autograd runs (threshold_backward, gelu_backward) or, where autograd would alias dy, the copies into separate
gradient buffers that GE2 writes."""
from __future__ import annotations

from graph_executor_v2.ops import elementwise as ew

from ._launch import close, prepared

ROWS, COLS = 8192, 8192
FORWARD_TARGET = {"copy_fraction": 0.85}
BACKWARD_TARGET = {"copy_fraction": 0.70}


def cases(torch):
    f16 = torch.float16
    n = ROWS * COLS
    nbytes = n * 2
    new = lambda *shape: torch.randn(*shape, device="cuda", dtype=f16)  # noqa: E731
    a, b, dy = new(ROWS, COLS), new(ROWS, COLS), new(ROWS, COLS)
    row = new(COLS)
    y, y_torch = torch.empty_like(a), torch.empty_like(a)
    native = ew._native_module()
    result = []

    def forward_case(name, op, inputs, torch_fn, moved):
        run = prepared(op, inputs, (y,), {})

        def check():
            run()
            close(torch, y, torch_fn(), name)

        result.append({"name": name, "ge2": run, "torch": torch_fn, "check": check, "bytes": moved,
                       "target": FORWARD_TARGET})

    forward_case("elementwise add f16 64M", "add", (a, b), lambda: torch.add(a, b, out=y_torch), 3 * nbytes)
    forward_case("elementwise mul bcast f16 8192x8192*[8192]", "mul", (a, row),
                 lambda: torch.mul(a, row, out=y_torch), 2 * nbytes + COLS * 2)
    forward_case("elementwise relu f16 64M", "relu", (a,), lambda: torch.relu(a), 2 * nbytes)
    forward_case("elementwise gelu f16 64M", "gelu", (a,),
                 lambda: torch.nn.functional.gelu(a, approximate="tanh"), 2 * nbytes)

    da, db, dbias = torch.empty_like(a), torch.empty_like(a), torch.empty(COLS, device="cuda", dtype=f16)
    da_t, db_t, dbias_t = torch.empty_like(a), torch.empty_like(a), torch.empty_like(dbias)
    a_shape, row_shape = [ROWS, COLS], [COLS]

    def add_backward():
        native.binary_backward("add", dy.data_ptr(), a.data_ptr(), b.data_ptr(), da.data_ptr(), db.data_ptr(),
                               a_shape, a_shape, "float16", 0)

    def add_backward_torch():
        da_t.copy_(dy)
        db_t.copy_(dy)

    def check_add():
        add_backward()
        close(torch, da, dy, "add backward da")
        close(torch, db, dy, "add backward db")

    result.append({"name": "elementwise add bwd f16 64M (da, db)", "ge2": add_backward, "torch": add_backward_torch,
                   "check": check_add, "bytes": 3 * nbytes, "target": BACKWARD_TARGET})

    def bias_backward():
        native.binary_backward("add", dy.data_ptr(), a.data_ptr(), row.data_ptr(), da.data_ptr(),
                               dbias.data_ptr(), a_shape, row_shape, "float16", 0)

    def bias_backward_torch():
        da_t.copy_(dy)
        torch.sum(dy, 0, out=dbias_t)

    def check_bias():
        bias_backward()
        close(torch, da, dy, "bias backward dx")
        close(torch, dbias, dy.float().sum(0), "bias backward dbias", rtol=5e-3, atol=0.5)

    result.append({"name": "elementwise add bwd bcast f16 8192x8192+[8192]", "ge2": bias_backward,
                   "torch": bias_backward_torch, "check": check_bias, "bytes": 2 * nbytes + COLS * 2,
                   "target": BACKWARD_TARGET})

    def mul_backward():
        native.binary_backward("mul", dy.data_ptr(), a.data_ptr(), row.data_ptr(), da.data_ptr(),
                               dbias.data_ptr(), a_shape, row_shape, "float16", 0)

    def mul_backward_torch():
        torch.mul(dy, row, out=da_t)
        torch.sum(dy * a, 0, out=dbias_t)

    def check_mul():
        mul_backward()
        mul_backward_torch()
        close(torch, da, da_t, "mul backward da")
        close(torch, dbias, (dy.float() * a.float()).sum(0), "mul backward db", rtol=5e-3, atol=0.5)

    result.append({"name": "elementwise mul bwd bcast f16 8192x8192*[8192]", "ge2": mul_backward,
                   "torch": mul_backward_torch, "check": check_mul, "bytes": 3 * nbytes + 2 * COLS * 2,
                   "target": BACKWARD_TARGET})

    for op, torch_backward in (
        ("relu", lambda: torch.ops.aten.threshold_backward(dy, a, 0)),
        ("gelu", lambda: torch.ops.aten.gelu_backward(dy, a, approximate="tanh")),
    ):
        def ge2_backward(op=op):
            native.unary_backward(op, dy.data_ptr(), a.data_ptr(), da.data_ptr(), n, "float16", 0)

        def check(op=op, torch_backward=torch_backward, ge2_backward=ge2_backward):
            ge2_backward()
            close(torch, da, torch_backward(), f"{op} backward")

        result.append({"name": f"elementwise {op} bwd f16 64M", "ge2": ge2_backward, "torch": torch_backward,
                       "check": check, "bytes": 3 * nbytes, "target": BACKWARD_TARGET})
    return result
