# The layers of fastudy, bottom to top, in the data-flow order of the design:
#
#   base      errors, logging, element types: what every layer needs (knows nothing above it)
#   kernels   number formats and attention kernels (CPU; kernels/cuda beside them)
#   src       the runner: runtime (MPI, reducers, scheduler) < core (config, provenance, train state)
#             < io (HDF5, checkpoints) < train (model, trainer)
#   analysis  distances and the ranking of deviation sources
#   jobs      the phases over all of the above, and the command line (jobs/main.cpp)
#
# Every source includes from the project root ("kernels/format.hpp"), but no target sees the whole
# root: fastudy_expose() gives a target an include directory holding only the folders it owns (as
# symbolic links into the source tree), and a target sees another folder only by linking the target
# that owns it. A file that includes a folder above its own layer therefore fails to compile
# ("src/runtime/mpi.hpp: No such file or directory"); tests/layers checks that it does, and
# scripts/check_layers.py checks the folder include graph against this order.
set(FASTUDY_LAYER_INCLUDE_ROOT ${CMAKE_BINARY_DIR}/layers)

# fastudy_layer_link(DIR folder): DIR/folder becomes a link to the source folder (relative to the
# project root), so that an include directory DIR offers that folder and nothing else.
function(fastudy_layer_link dir folder)
  get_filename_component(parent ${dir}/${folder} DIRECTORY)
  file(MAKE_DIRECTORY ${parent})
  if(NOT IS_SYMLINK ${dir}/${folder})
    file(CREATE_LINK ${CMAKE_SOURCE_DIR}/${folder} ${dir}/${folder} SYMBOLIC)
  endif()
endfunction()

# fastudy_expose(LIBRARY folder...): the library owns these folders and publishes them, and only
# them, to itself and to every target that links it.
function(fastudy_expose target)
  set(root ${FASTUDY_LAYER_INCLUDE_ROOT}/${target})
  foreach(folder IN LISTS ARGN)
    fastudy_layer_link(${root} ${folder})
  endforeach()
  target_include_directories(${target} PUBLIC ${root})
endfunction()
