# Project-wide settings for lazykv's own targets: warnings are errors in
# project code (third-party headers are included as system headers).
function(lazykv_target name)
  # -Wno-maybe-uninitialized: GCC 12 reports false positives inside its own
  # AVX-512 intrinsic headers (_mm512_cvtph_ps, _mm512_extractf64x4_pd: the
  # `__Y = __Y` idiom of _mm256_undefined_*); in a GCC sanitizer build at -O1 it
  # reports the same as -Wuninitialized.
  target_compile_options(${name} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Werror>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>>:-Wno-maybe-uninitialized>)
  if(LAZYKV_SANITIZE)
    target_compile_options(${name} PRIVATE $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>>:-Wno-uninitialized>)
  endif()
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
endfunction()

# A library from every .cc file of the calling folder (one folder = one component).
function(lazykv_library name)
  file(GLOB sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cc)
  if(NOT sources)  # a header-only component
    add_library(${name} INTERFACE)
    target_include_directories(${name} INTERFACE ${PROJECT_SOURCE_DIR})
    target_link_libraries(${name} INTERFACE ${ARGN})
    return()
  endif()
  add_library(${name} STATIC ${sources})
  lazykv_target(${name})
  target_link_libraries(${name} PUBLIC ${ARGN})
endfunction()
