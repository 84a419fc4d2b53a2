# ge2_use_cudnn(<target>): compiles <target> with GE2_WITH_CUDNN=1 and links cuDNN when cudnn.h and libcudnn are
# found, GE2_WITH_CUDNN=0 otherwise (the op's cuDNN candidate then reports itself as not built).
# Looked up in GE2_CUDNN_DIR (a folder with include/ and lib/), then the nvidia-cudnn-cu13 Python package (the cuDNN
# PyTorch loads, so one libcudnn lives in the process), then the CUDA toolkit.
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
  find_library(GE2_CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 HINTS ${hints} PATH_SUFFIXES lib lib64
               NO_DEFAULT_PATH)
  if(GE2_CUDNN_INCLUDE_DIR AND GE2_CUDNN_LIBRARY)
    message(STATUS "cuDNN for ${target}: ${GE2_CUDNN_LIBRARY} (headers ${GE2_CUDNN_INCLUDE_DIR})")
    get_filename_component(library_dir "${GE2_CUDNN_LIBRARY}" DIRECTORY)
    target_include_directories(${target} PRIVATE "${GE2_CUDNN_INCLUDE_DIR}")
    target_link_libraries(${target} PRIVATE "${GE2_CUDNN_LIBRARY}")
    target_compile_definitions(${target} PRIVATE GE2_WITH_CUDNN=1)
    set_target_properties(${target} PROPERTIES BUILD_RPATH "${library_dir}")
  else()
    message(STATUS "cuDNN for ${target}: not found (its cudnn candidate is not built)")
    target_compile_definitions(${target} PRIVATE GE2_WITH_CUDNN=0)
  endif()
endfunction()
