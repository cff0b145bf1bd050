# libtorch as one target, `instanttensor_libtorch`, for this project and for the consumers of its
# installed package (instanttensorConfig.cmake includes this file too).
#
# torch's own TorchConfig.cmake, for a CUDA build of torch, runs CUDA's CMake checks (a CUDA
# toolkit with nvcc, cudart and nvrtc) and stops when they fail, which is how most inference
# images ship: a CUDA torch wheel and no toolkit. instanttensor includes no CUDA header and needs
# no CUDA symbol (it drives devices through c10's generic interfaces), so in that case the target
# is assembled from the torch installation's own files: its include directories, libtorch,
# libtorch_cpu and libc10, the compile definitions torch_cpu declares, and TORCH_CXX_FLAGS.
#
# INSTANTTENSOR_LIBTORCH: AUTO (torch's config unless it is a CUDA build and no complete CUDA
# toolkit is found), CONFIG (always torch's config), FILES (never). Sets Torch_VERSION.
# Needs torch's cmake prefix (torch.utils.cmake_prefix_path) in CMAKE_PREFIX_PATH or Torch_DIR.
set(INSTANTTENSOR_LIBTORCH "AUTO" CACHE STRING "How libtorch is found: AUTO, CONFIG or FILES")

macro(instanttensor_find_libtorch)
  if(NOT TARGET instanttensor_libtorch)
    if(Torch_DIR AND EXISTS "${Torch_DIR}/TorchConfig.cmake")
      set(_it_torch_cmake "${Torch_DIR}")
    else()
      find_path(_it_torch_cmake TorchConfig.cmake PATH_SUFFIXES Torch share/cmake/Torch
                NO_CACHE)
    endif()
    if(NOT _it_torch_cmake)
      message(FATAL_ERROR "instanttensor: torch's CMake files were not found; pass "
              "-DCMAKE_PREFIX_PATH=$(python -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')")
    endif()
    get_filename_component(_it_torch_root "${_it_torch_cmake}/../../.." ABSOLUTE)
    set(_it_mode "${INSTANTTENSOR_LIBTORCH}")
    if(_it_mode STREQUAL "AUTO")
      set(_it_mode "CONFIG")
      if(EXISTS "${_it_torch_root}/lib/libtorch_cuda.so")
        find_package(CUDAToolkit QUIET)
        if(NOT (CUDAToolkit_FOUND AND TARGET CUDA::cudart AND TARGET CUDA::nvrtc))
          set(_it_mode "FILES")
          message(STATUS "instanttensor: CUDA build of torch without a complete CUDA toolkit: "
                  "libtorch from ${_it_torch_root}, without torch's CUDA checks")
        endif()
      endif()
    endif()
    add_library(instanttensor_libtorch INTERFACE IMPORTED GLOBAL)
    if(_it_mode STREQUAL "CONFIG")
      find_package(Torch REQUIRED CONFIG HINTS "${_it_torch_cmake}")
      target_link_libraries(instanttensor_libtorch INTERFACE ${TORCH_LIBRARIES})
    else()
      include("${_it_torch_cmake}/TorchConfigVersion.cmake")
      set(Torch_VERSION "${PACKAGE_VERSION}")
      set(_it_libraries)
      foreach(_it_name torch torch_cpu c10)
        find_library(_it_library_${_it_name} ${_it_name} PATHS "${_it_torch_root}/lib"
                     NO_DEFAULT_PATH NO_CACHE REQUIRED)
        list(APPEND _it_libraries "${_it_library_${_it_name}}")
      endforeach()
      # What torch_cpu's imported target would add: USE_DISTRIBUTED, USE_C10D_GLOO, ...
      file(READ "${_it_torch_cmake}/../Caffe2/Caffe2Targets.cmake" _it_targets)
      string(REGEX MATCH "add_library\\(torch_cpu SHARED IMPORTED\\)[^)]*INTERFACE_COMPILE_DEFINITIONS \"([^\"]*)\""
             _it_match "${_it_targets}")
      set(_it_definitions "${CMAKE_MATCH_1}")
      file(READ "${_it_torch_cmake}/TorchConfig.cmake" _it_config)
      string(REGEX MATCH "set\\(TORCH_CXX_FLAGS \"([^\"]*)\"\\)" _it_match "${_it_config}")
      set(TORCH_CXX_FLAGS "${CMAKE_MATCH_1}")
      set_target_properties(instanttensor_libtorch PROPERTIES
        INTERFACE_INCLUDE_DIRECTORIES
          "${_it_torch_root}/include;${_it_torch_root}/include/torch/csrc/api/include"
        INTERFACE_LINK_LIBRARIES "${_it_libraries}"
        INTERFACE_COMPILE_DEFINITIONS "${_it_definitions}")
      if(TORCH_CXX_FLAGS)
        separate_arguments(_it_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
        set_property(TARGET instanttensor_libtorch PROPERTY INTERFACE_COMPILE_OPTIONS ${_it_flags})
      endif()
    endif()
    if(Torch_VERSION VERSION_GREATER_EQUAL 2.14)
      # torch 2.14's headers require C++20 (ATen.h stops otherwise); earlier ones take C++17.
      set_property(TARGET instanttensor_libtorch APPEND PROPERTY INTERFACE_COMPILE_FEATURES cxx_std_20)
    endif()
  endif()
endmacro()
