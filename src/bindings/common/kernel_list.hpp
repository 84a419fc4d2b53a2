// kernels(): an op's kernel table (name, priority, description, constraints, fallback, alignment, dtypes) as a list
// of dicts for Python (graph_executor_v2/selection.py reads its candidates from it).
#pragma once
#include <vector>

#include "dtype.hpp"

#include <pybind11/pybind11.h>

namespace ge2::binding {

template <typename Info>
pybind11::list kernel_list(const std::vector<Info>& table) {
  pybind11::list rows;
  for (const Info& info : table) {
    pybind11::dict row;
    row["name"] = info.name;
    row["priority"] = info.priority;
    row["description"] = info.description;
    row["constraints"] = info.constraints;
    row["fallback"] = info.fallback;
    row["alignment"] = info.alignment;
    pybind11::tuple dtypes(info.dtypes.size());
    for (std::size_t i = 0; i < info.dtypes.size(); ++i) dtypes[i] = dtype_name(info.dtypes[i]);
    row["dtypes"] = dtypes;
    rows.append(row);
  }
  return rows;
}

}  // namespace ge2::binding
