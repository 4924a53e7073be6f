# The layer rule of docs/architecture.md, checked on every build: a file in
# src/<layer>/ may include project headers only from the layers its row names
# (and its own). A back edge — say formats/ including exec/ — stops the build
# here with the file, the line and the rule, before anything compiles.
#
#   cmake -DSRC_DIR=<repo>/src -DSTAMP=<file> -P cmake/check_layers.cmake
#
# A header-only include sees no link error, so this check, not the per-layer
# library targets, is what enforces the layering.

cmake_minimum_required(VERSION 3.25)

set(allowed_core         core)
set(allowed_io           core io)
set(allowed_pickle       core io pickle)
set(allowed_archive      core io archive)
set(allowed_model        core io pickle model)
set(allowed_formats      core io pickle archive model formats)
set(allowed_plan         core model plan)
set(allowed_exec         core io pickle archive model formats plan exec)
set(allowed_check        core io pickle archive model formats plan exec check)
set(allowed_diff         core io pickle archive model formats plan exec diff)
set(allowed_jobs         core io pickle archive model formats plan exec check diff jobs)
# The CLI parses options and prints: it sees the jobs and core, nothing else.
set(allowed_cli          core jobs cli)
# The dlopened plugins see LibTorch and the C table, never the library.
set(allowed_torch_plugin core torch_plugin)
set(allowed_cuda         core torch_plugin cuda)
set(allowed_plugin       core torch_plugin cuda plugin)
# The plugin C table lives with its loader in exec/ but is plain C: the one
# file of exec/ the plugins may include.
set(plugin_api exec/torch_plugin_api.h)

file(GLOB_RECURSE files RELATIVE "${SRC_DIR}" "${SRC_DIR}/*.h" "${SRC_DIR}/*.cc" "${SRC_DIR}/*.cu")
set(errors "")
foreach(file IN LISTS files)
  string(REGEX MATCH "^[^/]+" layer "${file}")
  if(NOT DEFINED allowed_${layer})
    string(APPEND errors "  src/${file}: folder '${layer}' is no layer of cmake/check_layers.cmake; add its row\n")
    continue()
  endif()
  file(STRINGS "${SRC_DIR}/${file}" includes REGEX "^[ \t]*#[ \t]*include[ \t]*\"[^\"]+/")
  foreach(line IN LISTS includes)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\".*$" "\\1" header "${line}")
    string(REGEX MATCH "^[^/]+" used "${header}")
    if(used IN_LIST allowed_${layer})
      continue()
    endif()
    if(header STREQUAL plugin_api AND layer MATCHES "^(torch_plugin|cuda|plugin)$")
      continue()
    endif()
    list(JOIN allowed_${layer} ", " may)
    string(APPEND errors "  src/${file}: includes \"${header}\", but ${layer}/ may use only: ${may}\n")
  endforeach()
endforeach()

if(errors)
  message(FATAL_ERROR "layering: a lower layer includes a higher one (docs/architecture.md):\n${errors}")
endif()
file(TOUCH "${STAMP}")
