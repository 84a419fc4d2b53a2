# ge2_use_cutlass(<target> [NEEDS_UTIL] <source>...): compiles <source> (CUTLASS 3.x / CuTe kernels) for sm_90a into an
# object library linked into <target>, and <target> with GE2_WITH_CUTLASS=1, when CUTLASS's headers are found;
# GE2_WITH_CUTLASS=0 otherwise (the op's CUTLASS candidates then report themselves as NOT BUILT, with the reason).
# Looked up in GE2_CUTLASS_DIR (a folder holding cutlass/cutlass.h or include/cutlass/cutlass.h; a CMake variable or
# an environment variable), then the Python environment's nvidia-cutlass package (cutlass_library/source/include).
# NEEDS_UTIL: the sources also need CUTLASS's utility headers (cutlass/util/packed_stride.hpp, which the sm90 conv
# collective includes), from tools/util/include beside include/ (as in CUTLASS's repository and the wheel).
# -DGE2_CUTLASS=OFF leaves them out (a quick build on a machine that has the headers but no Hopper GPU).
# Only these sources get sm_90a (wgmma and TMA need the `a` suffix); every other kernel keeps its architecture list.
option(GE2_CUTLASS "Build the CUTLASS sm_90a candidates when CUTLASS's headers are found" ON)
function(ge2_use_cutlass target)
  cmake_parse_arguments(PARSE_ARGV 1 cutlass "NEEDS_UTIL" "" "")
  set(sources ${cutlass_UNPARSED_ARGUMENTS})
  if(NOT GE2_CUTLASS)
    message(STATUS "CUTLASS for ${target}: turned off by -DGE2_CUTLASS=OFF (its CUTLASS candidates are NOT BUILT)")
    target_compile_definitions(${target} PRIVATE GE2_WITH_CUTLASS=0
                               "GE2_CUTLASS_NOT_BUILT_REASON=\"turned off at build time by -DGE2_CUTLASS=OFF\"")
    return()
  endif()
  set(hints "")
  foreach(dir "${GE2_CUTLASS_DIR}" "$ENV{GE2_CUTLASS_DIR}")
    if(dir)
      list(APPEND hints "${dir}")
    endif()
  endforeach()
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
      "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source'))"
    OUTPUT_VARIABLE python_dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE python_status)
  if(python_status EQUAL 0 AND python_dir)
    list(APPEND hints "${python_dir}")
  endif()
  find_path(GE2_CUTLASS_INCLUDE_DIR cutlass/cutlass.h HINTS ${hints} PATH_SUFFIXES include NO_DEFAULT_PATH)
  set(include_dirs "${GE2_CUTLASS_INCLUDE_DIR}")
  if(cutlass_NEEDS_UTIL AND GE2_CUTLASS_INCLUDE_DIR)
    find_path(GE2_CUTLASS_UTIL_INCLUDE_DIR cutlass/util/packed_stride.hpp
              HINTS ${hints} "${GE2_CUTLASS_INCLUDE_DIR}/.." PATH_SUFFIXES tools/util/include include NO_DEFAULT_PATH)
    if(NOT GE2_CUTLASS_UTIL_INCLUDE_DIR)
      message(STATUS "CUTLASS for ${target}: cutlass/util/packed_stride.hpp not found beside ${GE2_CUTLASS_INCLUDE_DIR} "
                     "(its CUTLASS candidates are NOT BUILT: CUTLASS's tools/util/include is needed too)")
      target_compile_definitions(${target} PRIVATE GE2_WITH_CUTLASS=0
        "GE2_CUTLASS_NOT_BUILT_REASON=\"CMake found CUTLASS's headers but not its tools/util/include (cutlass/util/packed_stride.hpp)\"")
      return()
    endif()
    list(APPEND include_dirs "${GE2_CUTLASS_UTIL_INCLUDE_DIR}")
  endif()
  if(GE2_CUTLASS_INCLUDE_DIR)
    message(STATUS "CUTLASS for ${target}: ${include_dirs} (its sm_90a kernels are built)")
    set(objects ${target}_cutlass_sm90a)
    add_library(${objects} OBJECT ${sources})
    set_target_properties(${objects} PROPERTIES CUDA_ARCHITECTURES 90a POSITION_INDEPENDENT_CODE ON
                                                CUDA_RUNTIME_LIBRARY Shared)
    target_compile_features(${objects} PRIVATE cxx_std_17 cuda_std_17)
    # SYSTEM: CUTLASS's own warnings are not GE2's.
    target_include_directories(${objects} SYSTEM PRIVATE ${include_dirs})
    target_include_directories(${objects} PRIVATE "${GE2_COMMON_INCLUDE_DIR}")
    target_compile_options(${objects} PRIVATE --expt-relaxed-constexpr -lineinfo -Xcompiler=-fvisibility=hidden)
    target_link_libraries(${target} PRIVATE ${objects})
    target_compile_definitions(${target} PRIVATE GE2_WITH_CUTLASS=1)
  else()
    message(STATUS "CUTLASS for ${target}: cutlass/cutlass.h not found (its CUTLASS candidates are NOT BUILT: "
                   "install the cutlass extra, nvidia-cutlass, or set GE2_CUTLASS_DIR)")
    target_compile_definitions(${target} PRIVATE GE2_WITH_CUTLASS=0
      "GE2_CUTLASS_NOT_BUILT_REASON=\"CMake found no CUTLASS headers: install the cutlass extra (nvidia-cutlass) or set GE2_CUTLASS_DIR\"")
  endif()
endfunction()
