# find_package(graph_executor_v2): for projects that build their own _ops_<name> modules against GE2.
#
# Provides add_standalone_op(...) (see AddStandaloneOp.cmake) with GE2's shim headers (backends/cuda/ops/_common)
# and binding helpers (src/bindings/common) on the include path. Works from an installed package
# (site-packages/graph_executor_v2/cmake; scikit-build-core puts site-packages on CMAKE_PREFIX_PATH) and from a
# source checkout (<repo>/cmake). `python -c "import graph_executor_v2; print(graph_executor_v2.cmake_dir())"`
# prints this directory for -Dgraph_executor_v2_DIR=... . Call after project(... LANGUAGES CXX CUDA).
include(CMakeFindDependencyMacro)
find_dependency(CUDAToolkit)
set(PYBIND11_FINDPYTHON ON)
find_dependency(Python COMPONENTS Interpreter Development.Module)
if(NOT pybind11_DIR)  # the pybind11 of the Python that builds, as when GE2 itself was built
  execute_process(COMMAND "${Python_EXECUTABLE}" -m pybind11 --cmakedir OUTPUT_VARIABLE pybind11_DIR
                  OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
endif()
find_dependency(pybind11 CONFIG)
include("${CMAKE_CURRENT_LIST_DIR}/AddStandaloneOp.cmake")
set(graph_executor_v2_INCLUDE_DIRS "${GE2_COMMON_INCLUDE_DIR}" "${GE2_BINDING_INCLUDE_DIR}")
