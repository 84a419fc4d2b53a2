// _ops_quantize_fp8: the native face of the quantize_fp8 op. Raw device addresses and sizes in, work enqueued on
// `stream`; graph_executor_v2.ops.quantize_fp8 checks arguments for users first.
#include <utility>
#include <vector>

#include "api.hpp"
#include "kernel_list.hpp"
#include "op_binding.hpp"

namespace py = pybind11;
using ge2::binding::as_pointer;
using ge2::binding::as_stream;

PYBIND11_MODULE(_ops_quantize_fp8, m) {
  m.doc() = "GE2 quantize_fp8: y = FP8(x * scale) (saturating) and amax = max |x| in one pass";

  m.def(
      "forward",
      [](std::uintptr_t x, const std::string& x_dtype, std::uintptr_t scale, std::uintptr_t y,
         const std::string& dtype, std::uintptr_t amax, int64_t numel, std::uintptr_t stream) {
        const auto from = ge2::dtype_from_name(x_dtype, "x_dtype"), to = ge2::dtype_from_name(dtype);
        ge2::binding::ReleaseGil release;
        return std::string(ge2::quantize_fp8::forward(as_pointer(x), from, as_pointer<const float>(scale),
                                                      as_pointer(y), to, as_pointer<float>(amax), numel,
                                                      as_stream(stream)));
      },
      py::arg("x"), py::arg("x_dtype"), py::arg("scale"), py::arg("y"), py::arg("dtype"), py::arg("amax"),
      py::arg("numel"), py::arg("stream"),
      "Enqueues y = FP8(x * scale) and amax = max |x| (float32 device scalars scale and amax); returns the kernel "
      "that ran.");

  m.def(
      "quantize_transpose",
      [](std::uintptr_t x, const std::string& x_dtype, std::uintptr_t scale, std::uintptr_t y, std::uintptr_t y_t,
         const std::string& dtype, std::uintptr_t amax, std::uintptr_t column_sum, int64_t rows, int64_t cols,
         std::uintptr_t stream, const std::string& act, std::uintptr_t preact, std::uintptr_t x1, int64_t x1_cols,
         std::uintptr_t x2, int64_t x2_cols) {
        const auto from = ge2::dtype_from_name(x_dtype, "x_dtype"), to = ge2::dtype_from_name(dtype);
        const auto activation = ge2::act_from_name(act);
        if (x2_cols != 0 && x1_cols == 0) throw std::invalid_argument("x2: given without x1");
        std::vector<ge2::quantize_fp8::ColumnBlock> more_blocks;
        for (const auto& [data, block_cols] : {std::pair{x1, x1_cols}, std::pair{x2, x2_cols}}) {
          if (block_cols != 0) more_blocks.push_back({as_pointer(data), block_cols});
        }
        ge2::binding::ReleaseGil release;
        ge2::quantize_fp8::quantize_transpose(as_pointer(x), from, as_pointer<const float>(scale), as_pointer(y),
                                              as_pointer(y_t), to, as_pointer<float>(amax), as_pointer(column_sum),
                                              rows, cols, as_stream(stream), activation, as_pointer(preact),
                                              more_blocks);
      },
      py::arg("x"), py::arg("x_dtype"), py::arg("scale"), py::arg("y"), py::arg("y_t"), py::arg("dtype"),
      py::arg("amax"), py::arg("column_sum"), py::arg("rows"), py::arg("cols"), py::arg("stream"),
      py::arg("act") = "none", py::arg("preact") = 0, py::arg("x1") = 0, py::arg("x1_cols") = 0,
      py::arg("x2") = 0, py::arg("x2_cols") = 0,
      "Enqueues y = FP8(v * scale), y_t = y's transpose and amax = max |v| for a 2-d x [rows, cols], and the sum "
      "of v over its rows into column_sum [cols] (x's dtype) unless its address is 0; v = x, or with act: act(x) "
      "(preact 0) or x * act'(preact) (preact [rows, cols] of x's dtype). With x1_cols (and x2_cols) > 0, x's "
      "columns come in blocks read in place of their concatenation: x [rows, cols - x1_cols - x2_cols], then x1 "
      "[rows, x1_cols], then x2 [rows, x2_cols] (no preact then).");

  m.def(
      "quantize_add_transpose",
      [](std::uintptr_t x, std::uintptr_t addend, std::uintptr_t sum, const std::string& value_dtype,
         std::uintptr_t scale, std::uintptr_t y, std::uintptr_t y_t, const std::string& dtype, std::uintptr_t amax,
         std::uintptr_t column_sum, int64_t rows, int64_t cols, std::uintptr_t stream) {
        const auto value = ge2::dtype_from_name(value_dtype, "value_dtype"), to = ge2::dtype_from_name(dtype);
        ge2::binding::ReleaseGil release;
        ge2::quantize_fp8::quantize_add_transpose(as_pointer<const float>(x), as_pointer<const float>(addend),
                                                  as_pointer<float>(sum), value, as_pointer<const float>(scale),
                                                  as_pointer(y), as_pointer(y_t), to, as_pointer<float>(amax),
                                                  as_pointer(column_sum), rows, cols, as_stream(stream));
      },
      py::arg("x"), py::arg("addend"), py::arg("sum"), py::arg("value_dtype"), py::arg("scale"), py::arg("y"),
      py::arg("y_t"), py::arg("dtype"), py::arg("amax"), py::arg("column_sum"), py::arg("rows"), py::arg("cols"),
      py::arg("stream"),
      "Enqueues sum = x + addend (float32 [rows, cols]) and quantize_transpose of v = sum rounded to value_dtype: "
      "y, y_t, amax = max |v| and the sum of v over the rows into column_sum [cols] (value_dtype) unless its "
      "address is 0.");

  m.def(
      "quantize_transpose_multi",
      [](const std::vector<std::uintptr_t>& inputs, const std::vector<std::uintptr_t>& outputs,
         const std::vector<int64_t>& rows, const std::vector<int64_t>& cols, const std::string& x_dtype,
         const std::string& dtype, std::uintptr_t stream) {
        if (inputs.size() != 2 * rows.size() || cols.size() != rows.size() || outputs.size() != 3 * rows.size()) {
          throw std::invalid_argument("inputs, outputs, rows, cols: expected 2 input and 3 output addresses per "
                                      "tensor and one rows and cols each (" + std::to_string(rows.size()) +
                                      " rows), got " + std::to_string(inputs.size()) + ", " +
                                      std::to_string(outputs.size()) + ", " + std::to_string(cols.size()));
        }
        const auto from = ge2::dtype_from_name(x_dtype, "x_dtype"), to = ge2::dtype_from_name(dtype);
        std::vector<ge2::quantize_fp8::MultiQuantize> tensors;
        for (std::size_t i = 0; i < rows.size(); ++i) {
          tensors.push_back({as_pointer(inputs[2 * i]), as_pointer<const float>(inputs[2 * i + 1]),
                             as_pointer(outputs[3 * i]), as_pointer(outputs[3 * i + 1]),
                             as_pointer<float>(outputs[3 * i + 2]), rows[i], cols[i]});
        }
        ge2::binding::ReleaseGil release;
        ge2::quantize_fp8::quantize_transpose_multi(tensors, from, to, as_stream(stream));
      },
      py::arg("inputs"), py::arg("outputs"), py::arg("rows"), py::arg("cols"), py::arg("x_dtype"), py::arg("dtype"),
      py::arg("stream"),
      "Enqueues quantize_transpose for several 2-d tensors in as few launches as possible: inputs (x, scale) and "
      "outputs (y, y_t, amax) per tensor, x [rows[i], cols[i]] of x_dtype.");

  m.def(
      "scale_update",
      [](const std::vector<std::uintptr_t>& inputs, const std::vector<std::uintptr_t>& outputs,
         const std::vector<int64_t>& lengths, const std::string& dtype, int margin, std::uintptr_t stream) {
        if (inputs.size() != 3 * lengths.size() || outputs.size() != inputs.size()) {
          throw std::invalid_argument("inputs, outputs: expected 3 addresses per history length (" +
                                      std::to_string(3 * lengths.size()) + "), got " + std::to_string(inputs.size()) +
                                      " and " + std::to_string(outputs.size()));
        }
        const auto type = ge2::dtype_from_name(dtype);
        std::vector<ge2::quantize_fp8::ScaleState> states;
        for (std::size_t i = 0; i < lengths.size(); ++i) {
          states.push_back({as_pointer<const float>(inputs[3 * i]), as_pointer<const float>(inputs[3 * i + 1]),
                            as_pointer<const float>(inputs[3 * i + 2]), as_pointer<float>(outputs[3 * i]),
                            as_pointer<float>(outputs[3 * i + 1]), as_pointer<float>(outputs[3 * i + 2]), lengths[i]});
        }
        ge2::binding::ReleaseGil release;
        ge2::quantize_fp8::scale_update(states, type, margin, as_stream(stream));
      },
      py::arg("inputs"), py::arg("outputs"), py::arg("lengths"), py::arg("dtype"), py::arg("margin"),
      py::arg("stream"),
      "Enqueues delayed scaling's update of every tensor's amax history and scale (float32 device arrays): inputs "
      "(history, scale, amax) and outputs (new_history, new_scale, new_scale_inv) per tensor, in a few launches.");

  m.def("kernels", [] { return ge2::binding::kernel_list(ge2::quantize_fp8::kernel_table()); },
        "The candidates of quantize_fp8 ('cuda'), quantize_fp8_transpose ('transpose') and fp8_scale_update "
        "('scale_update') with their constraints.");
}
