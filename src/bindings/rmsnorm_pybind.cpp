// _ops_rmsnorm: the rmsnorm module of the row_norm op folder (binding shared with layernorm; beta, mean, dbeta 0).
#include "row_norm_binding.hpp"

PYBIND11_MODULE(_ops_rmsnorm, m) {
  m.doc() = "GE2 rmsnorm over the last axis: y = x / sqrt(mean(x^2) + eps) * gamma";
  ge2::binding::def_row_norm(m);
}
