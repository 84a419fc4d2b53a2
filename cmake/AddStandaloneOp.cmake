# add_standalone_op(<op> [LIBS <lib>...] [SOURCE_DIR <dir>] [BINDING <file>] [PACKAGE <name>] [OUTPUT_DIR <dir>])
#
# Builds the pybind11 module _ops_<op> from
#   <SOURCE_DIR>/launcher.cu, kernels/*.cu, backward.cu (if present)   default: backends/cuda/ops/<op>
#     (kernels/*.cpp too: host-only code around a library, compiled as C++, e.g. conv2d's cuDNN graph candidate)
#     (one folder may serve several ops: row_norm builds layernorm and rmsnorm; GE2_OP_NAME tells them apart)
#   <BINDING>                                                            default: src/bindings/<op>_pybind.cpp
# (relative paths are taken from the calling project's source directory), with GE2's shim headers (_common), the
# kernels op folders share and the binding helpers on the include path, linked against the shared CUDA runtime (so
# streams and graph capture are shared across modules) plus the listed libraries.
#
# The module belongs to the Python package PACKAGE (default graph_executor_v2): a wheel built by scikit-build-core
# installs it into <PACKAGE>/, a plain CMake build writes it to OUTPUT_DIR (default python/<PACKAGE>) so that
# PYTHONPATH=python finds it. GE2 itself uses the defaults; an out-of-tree project (find_package(graph_executor_v2))
# passes its own PACKAGE and, if its layout differs, SOURCE_DIR and BINDING.
#
# GE2_ONLY_OPS (a list, empty = all) builds a subset, e.g. -DGE2_ONLY_OPS="gemm;softmax" while working on one op.

# Where the shim headers are: next to this file in an installed package (<pkg>/cmake, <pkg>/include), in the
# repository otherwise (cmake/, backends/cuda/ops/_common, src/bindings/common). Kernels that several op folders
# share (the strided copy) are in backends/cuda/kernels (<pkg>/include/kernels installed), apart from the shims.
if(EXISTS "${CMAKE_CURRENT_LIST_DIR}/../include/_common/status.hpp")
  get_filename_component(GE2_COMMON_INCLUDE_DIR "${CMAKE_CURRENT_LIST_DIR}/../include/_common" ABSOLUTE)
  get_filename_component(GE2_BINDING_INCLUDE_DIR "${CMAKE_CURRENT_LIST_DIR}/../include/bindings_common" ABSOLUTE)
  get_filename_component(GE2_SHARED_KERNELS_INCLUDE_DIR "${CMAKE_CURRENT_LIST_DIR}/../include/kernels" ABSOLUTE)
else()
  get_filename_component(GE2_COMMON_INCLUDE_DIR "${CMAKE_CURRENT_LIST_DIR}/../backends/cuda/ops/_common" ABSOLUTE)
  get_filename_component(GE2_BINDING_INCLUDE_DIR "${CMAKE_CURRENT_LIST_DIR}/../src/bindings/common" ABSOLUTE)
  get_filename_component(GE2_SHARED_KERNELS_INCLUDE_DIR "${CMAKE_CURRENT_LIST_DIR}/../backends/cuda/kernels" ABSOLUTE)
endif()

function(add_standalone_op op)
  cmake_parse_arguments(ARG "" "SOURCE_DIR;BINDING;PACKAGE;OUTPUT_DIR" "LIBS" ${ARGN})
  if(ARG_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "add_standalone_op(${op}): unknown arguments ${ARG_UNPARSED_ARGUMENTS}")
  endif()
  if(GE2_ONLY_OPS AND NOT op IN_LIST GE2_ONLY_OPS)
    return()
  endif()
  if(NOT ARG_SOURCE_DIR)
    set(ARG_SOURCE_DIR "backends/cuda/ops/${op}")
  endif()
  if(NOT ARG_BINDING)
    set(ARG_BINDING "src/bindings/${op}_pybind.cpp")
  endif()
  get_filename_component(op_dir "${ARG_SOURCE_DIR}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
  get_filename_component(binding "${ARG_BINDING}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
  foreach(required "${op_dir}/launcher.cu" "${binding}")
    if(NOT EXISTS "${required}")
      message(FATAL_ERROR "add_standalone_op(${op}): ${required} not found")
    endif()
  endforeach()
  file(GLOB kernel_sources CONFIGURE_DEPENDS "${op_dir}/kernels/*.cu" "${op_dir}/kernels/*.cpp")
  set(sources "${op_dir}/launcher.cu" ${kernel_sources} "${binding}")
  if(EXISTS "${op_dir}/backward.cu")
    list(APPEND sources "${op_dir}/backward.cu")
  endif()

  set(target _ops_${op})
  pybind11_add_module(${target} MODULE ${sources})
  target_include_directories(${target} PRIVATE "${GE2_COMMON_INCLUDE_DIR}" "${op_dir}" "${GE2_BINDING_INCLUDE_DIR}"
    "${GE2_SHARED_KERNELS_INCLUDE_DIR}")
  target_link_libraries(${target} PRIVATE CUDA::cudart ${ARG_LIBS})
  target_compile_definitions(${target} PRIVATE GE2_OP_NAME="${op}")
  ge2_finish_module(${target} PACKAGE "${ARG_PACKAGE}" OUTPUT_DIR "${ARG_OUTPUT_DIR}")
endfunction()

# Common settings for every native module (_runtime and _ops_*): C++17/CUDA flags and where the module lands
# (see PACKAGE and OUTPUT_DIR above; the defaults are GE2's own).
function(ge2_finish_module target)
  cmake_parse_arguments(ARG "" "PACKAGE;OUTPUT_DIR" "" ${ARGN})
  if(NOT ARG_PACKAGE)
    set(ARG_PACKAGE graph_executor_v2)
  endif()
  if(NOT ARG_OUTPUT_DIR)
    set(ARG_OUTPUT_DIR "python/${ARG_PACKAGE}")
  endif()
  get_filename_component(output_dir "${ARG_OUTPUT_DIR}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
  set_target_properties(${target} PROPERTIES
    CUDA_SEPARABLE_COMPILATION OFF
    CUDA_RUNTIME_LIBRARY Shared)
  target_compile_features(${target} PRIVATE cxx_std_17 cuda_std_17)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo -Xcompiler=-fvisibility=hidden>)
  if(CMAKE_SYSTEM_NAME STREQUAL "Linux")
    # A toolchain that links libstdc++ statically (the GPU machine's g++ does) would otherwise export that copy from
    # the module; once another library puts the shared libstdc++ into the global scope (cuDNN's engine libraries),
    # the module's lazily bound calls go there while its data stays here: mixed locales crash the first number an
    # ostream formats (the cuDNN frontend's engine names). Hidden, the module's copy binds to itself.
    target_link_options(${target} PRIVATE "LINKER:--exclude-libs,ALL")
  endif()
  if(SKBUILD)
    install(TARGETS ${target} LIBRARY DESTINATION ${ARG_PACKAGE})
  else()
    # Plain CMake build: put the module next to the Python sources so PYTHONPATH=python works.
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY "${output_dir}")
  endif()
endfunction()
