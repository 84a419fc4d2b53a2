// _ops_layernorm: the layernorm module of the row_norm op folder (binding shared with rmsnorm).
#include "row_norm_binding.hpp"

PYBIND11_MODULE(_ops_layernorm, m) {
  m.doc() = "GE2 layernorm over the last axis: y = (x - mean) / sqrt(var + eps) * gamma + beta";
  ge2::binding::def_row_norm(m);
}
