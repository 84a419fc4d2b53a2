# ge2_use_cudnn(<target>): compiles <target> with GE2_WITH_CUDNN=1 and links cuDNN when cudnn.h and libcudnn are
# found, GE2_WITH_CUDNN=0 otherwise (the op's cuDNN candidates then report themselves as not built).
# Looked up in GE2_CUDNN_DIR (a folder with include/ and lib/), then the nvidia-cudnn-cu13 Python package (the cuDNN
# PyTorch loads, so one libcudnn lives in the process), then the CUDA toolkit.
#
# With cuDNN, the cuDNN frontend (header-only C++, the graph API) too: GE2_WITH_CUDNN_FRONTEND=1 when
# cudnn_frontend.h is found, 0 otherwise. Looked up in GE2_CUDNN_FRONTEND_DIR (a folder holding cudnn_frontend.h or
# include/cudnn_frontend.h; a CMake variable or an environment variable), then the Python environment (the
# nvidia-cudnn-frontend wheel puts include/ into site-packages: the installed package's location, and sysconfig's
# purelib/platlib, which stay the environment's under pip's build isolation), then the CUDA toolkit.
function(ge2_use_cudnn target)
  set(hints "")
  if(GE2_CUDNN_DIR)
    list(APPEND hints "${GE2_CUDNN_DIR}")
  endif()
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c "import nvidia.cudnn as m; print(list(m.__path__)[0])"
    OUTPUT_VARIABLE wheel_dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE wheel_status)
  if(wheel_status EQUAL 0 AND wheel_dir)
    list(APPEND hints "${wheel_dir}")
  endif()
  list(APPEND hints "${CUDAToolkit_LIBRARY_ROOT}" "${CUDAToolkit_TARGET_DIR}")
  find_path(GE2_CUDNN_INCLUDE_DIR cudnn.h HINTS ${hints} PATH_SUFFIXES include NO_DEFAULT_PATH)
  # NAMES_PER_DIR: the library next to the headers found (the wheel has only libcudnn.so.9, the toolkit
  # libcudnn.so too); a newer header over an older library leaves symbols undefined.
  find_library(GE2_CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 NAMES_PER_DIR HINTS ${hints} PATH_SUFFIXES lib lib64
               NO_DEFAULT_PATH)
  if(GE2_CUDNN_INCLUDE_DIR AND GE2_CUDNN_LIBRARY)
    message(STATUS "cuDNN for ${target}: ${GE2_CUDNN_LIBRARY} (headers ${GE2_CUDNN_INCLUDE_DIR})")
    get_filename_component(library_dir "${GE2_CUDNN_LIBRARY}" DIRECTORY)
    target_include_directories(${target} PRIVATE "${GE2_CUDNN_INCLUDE_DIR}")
    target_link_libraries(${target} PRIVATE "${GE2_CUDNN_LIBRARY}")
    target_compile_definitions(${target} PRIVATE GE2_WITH_CUDNN=1)
    set_target_properties(${target} PROPERTIES BUILD_RPATH "${library_dir}")
    ge2_use_cudnn_frontend(${target})
  else()
    message(STATUS "cuDNN for ${target}: not found (its cudnn candidates are not built)")
    target_compile_definitions(${target} PRIVATE GE2_WITH_CUDNN=0 GE2_WITH_CUDNN_FRONTEND=0)
  endif()
endfunction()

function(ge2_use_cudnn_frontend target)
  set(hints "")
  foreach(dir "${GE2_CUDNN_FRONTEND_DIR}" "$ENV{GE2_CUDNN_FRONTEND_DIR}")
    if(dir)
      list(APPEND hints "${dir}")
    endif()
  endforeach()
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
      "import importlib.metadata as m, sysconfig as s
dirs = [s.get_paths()[k] for k in ('purelib', 'platlib')]
try:
    dirs.insert(0, str(m.distribution('nvidia-cudnn-frontend').locate_file('')))
except m.PackageNotFoundError:
    pass
print(';'.join(dirs))"
    OUTPUT_VARIABLE python_dirs OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  list(APPEND hints ${python_dirs} ${CUDAToolkit_INCLUDE_DIRS})
  find_path(GE2_CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h HINTS ${hints} PATH_SUFFIXES include NO_DEFAULT_PATH)
  if(GE2_CUDNN_FRONTEND_INCLUDE_DIR)
    message(STATUS "cuDNN frontend for ${target}: ${GE2_CUDNN_FRONTEND_INCLUDE_DIR}")
    # SYSTEM: the frontend's own warnings are not GE2's; no JSON: GE2 serializes no graphs (and compiles faster).
    # NVRTC: the frontend's own runtime-compiled engines call it.
    target_include_directories(${target} SYSTEM PRIVATE "${GE2_CUDNN_FRONTEND_INCLUDE_DIR}")
    target_link_libraries(${target} PRIVATE CUDA::nvrtc)
    target_compile_definitions(${target} PRIVATE GE2_WITH_CUDNN_FRONTEND=1 CUDNN_FRONTEND_SKIP_JSON_LIB)
  else()
    message(STATUS "cuDNN frontend for ${target}: cudnn_frontend.h not found (its cuDNN graph API candidate is not "
                   "built: install nvidia-cudnn-frontend or set GE2_CUDNN_FRONTEND_DIR)")
    target_compile_definitions(${target} PRIVATE GE2_WITH_CUDNN_FRONTEND=0)
  endif()
endfunction()
