# add_standalone_op(<op> [DIR <folder>] [LIBS <lib>...])
#
# Builds the pybind11 module _ops_<op> from
#   backends/cuda/ops/<folder>/launcher.cu, kernels/*.cu, backward.cu (if present); <folder> is <op> unless DIR
#   names an op folder that serves several ops (row_norm: layernorm and rmsnorm; GE2_OP_NAME tells them apart)
#   src/bindings/<op>_pybind.cpp
# with backends/cuda/ops/_common and src/bindings/common on the include path, linked against the shared CUDA
# runtime (so streams and graph capture are shared across modules) plus the listed libraries.
#
# GE2_ONLY_OPS (a list, empty = all) builds a subset, e.g. -DGE2_ONLY_OPS="gemm;softmax" while working on one op.
function(add_standalone_op op)
  cmake_parse_arguments(ARG "" "DIR" "LIBS" ${ARGN})
  if(GE2_ONLY_OPS AND NOT op IN_LIST GE2_ONLY_OPS)
    return()
  endif()
  if(NOT ARG_DIR)
    set(ARG_DIR ${op})
  endif()
  set(op_dir "${PROJECT_SOURCE_DIR}/backends/cuda/ops/${ARG_DIR}")
  if(NOT EXISTS "${op_dir}/launcher.cu")
    message(FATAL_ERROR "add_standalone_op(${op}): ${op_dir}/launcher.cu not found")
  endif()
  file(GLOB kernel_sources CONFIGURE_DEPENDS "${op_dir}/kernels/*.cu")
  set(sources "${op_dir}/launcher.cu" ${kernel_sources} "${PROJECT_SOURCE_DIR}/src/bindings/${op}_pybind.cpp")
  if(EXISTS "${op_dir}/backward.cu")
    list(APPEND sources "${op_dir}/backward.cu")
  endif()

  set(target _ops_${op})
  pybind11_add_module(${target} MODULE ${sources})
  target_include_directories(${target} PRIVATE
    "${PROJECT_SOURCE_DIR}/backends/cuda/ops/_common"
    "${op_dir}"
    "${PROJECT_SOURCE_DIR}/src/bindings/common")
  target_link_libraries(${target} PRIVATE CUDA::cudart ${ARG_LIBS})
  target_compile_definitions(${target} PRIVATE GE2_OP_NAME="${op}")
  ge2_finish_module(${target})
endfunction()

# Common settings for every native module (_runtime and _ops_*): C++17/CUDA flags and where the module lands.
function(ge2_finish_module target)
  set_target_properties(${target} PROPERTIES
    CUDA_SEPARABLE_COMPILATION OFF
    CUDA_RUNTIME_LIBRARY Shared)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo -Xcompiler=-fvisibility=hidden>)
  if(SKBUILD)
    install(TARGETS ${target} LIBRARY DESTINATION graph_executor_v2)
  else()
    # Plain CMake build: put the module next to the Python sources so PYTHONPATH=python works.
    set_target_properties(${target} PROPERTIES
      LIBRARY_OUTPUT_DIRECTORY "${PROJECT_SOURCE_DIR}/python/graph_executor_v2")
  endif()
endfunction()
