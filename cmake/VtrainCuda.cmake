# Finds the CUDA toolkit, cuDNN and NCCL for the CUDA backend.
# Sets VTRAIN_HAVE_CUDA and the imported targets vtrain::cudnn, vtrain::nccl.
# With VTRAIN_CUDA=ON a missing piece is an error; with AUTO it only disables
# the backend.
include(CheckLanguage)
check_language(CUDA)
set(_vtrain_cuda_missing "")
if(CMAKE_CUDA_COMPILER)
  find_package(CUDAToolkit)
else()
  list(APPEND _vtrain_cuda_missing "nvcc")
endif()
if(CUDAToolkit_FOUND)
  find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
  find_library(CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib64 lib)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib64 lib)
  foreach(_v CUDNN_INCLUDE_DIR CUDNN_LIBRARY NCCL_INCLUDE_DIR NCCL_LIBRARY)
    if(NOT ${_v})
      list(APPEND _vtrain_cuda_missing ${_v})
    endif()
  endforeach()
else()
  list(APPEND _vtrain_cuda_missing "CUDAToolkit")
endif()

if(_vtrain_cuda_missing)
  if(VTRAIN_CUDA STREQUAL "ON")
    message(FATAL_ERROR "VTRAIN_CUDA=ON but not found: ${_vtrain_cuda_missing}")
  endif()
  message(STATUS "vtrain: CUDA backend disabled, missing: ${_vtrain_cuda_missing}")
  return()
endif()

enable_language(CUDA)
set(CMAKE_CUDA_ARCHITECTURES ${VTRAIN_CUDA_ARCHITECTURES})
# The shared CUDA runtime for every target (also executables that only link
# CUDA code): one runtime in the process, the one cuDNN, cuBLAS and NCCL use.
set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
add_library(vtrain::cudnn UNKNOWN IMPORTED)
set_target_properties(vtrain::cudnn PROPERTIES
  IMPORTED_LOCATION "${CUDNN_LIBRARY}" INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_INCLUDE_DIR}")
add_library(vtrain::nccl UNKNOWN IMPORTED)
set_target_properties(vtrain::nccl PROPERTIES
  IMPORTED_LOCATION "${NCCL_LIBRARY}" INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
set(VTRAIN_HAVE_CUDA ON)
