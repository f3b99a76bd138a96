# Test helpers shared by every tests/ subdirectory.
#   fastudy_gtest(NAME SOURCES a.cpp b.cpp LIBS lib1 lib2 [LABELS l] [RANKS 1 2 4 [SINGLETON]])
# builds one GoogleTest executable. Without RANKS it is registered test by test (gtest_discover_tests);
# with RANKS it runs whole under mpirun once per rank count (name_np<N>), and with SINGLETON also once
# without mpirun (name_singleton: Open MPI's singleton init makes it one rank).
include(GoogleTest)
include_guard(GLOBAL)

# An include directory with the tests folder alone (see cmake/FastudyLayers.cmake).
set(FASTUDY_TESTS_INCLUDE ${FASTUDY_LAYER_INCLUDE_ROOT}/tests)
fastudy_layer_link(${FASTUDY_TESTS_INCLUDE} tests)

# FASTUDY_TORCH_THREADS=1: ctest -j N already runs N tests side by side, one per core, and results do
# not depend on the thread count (tests/train/test_threads.cpp sets its own counts and checks that).
set(FASTUDY_MPI_ENV "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;FASTUDY_TORCH_THREADS=1")

function(fastudy_gtest name)
  cmake_parse_arguments(T "SINGLETON" "TIMEOUT" "SOURCES;LIBS;LABELS;RANKS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main)
  # Tests include their own helpers from the project root ("tests/cli/cli_util.hpp") and see the
  # libraries through T_LIBS only.
  target_include_directories(${name} PRIVATE ${FASTUDY_TESTS_INCLUDE})
  target_compile_definitions(${name} PRIVATE FASTUDY_TEST_DATA="${CMAKE_SOURCE_DIR}/tests/data"
                                             FASTUDY_CONFIGS="${CMAKE_SOURCE_DIR}/configs"
                                             FASTUDY_BINARY_DIR="${CMAKE_BINARY_DIR}")
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 600)
  endif()
  if(T_RANKS)
    foreach(n IN LISTS T_RANKS)
      add_test(NAME ${name}_np${n}
               COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} --oversubscribe
                       ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${name}> ${MPIEXEC_POSTFLAGS})
      set_tests_properties(${name}_np${n} PROPERTIES ENVIRONMENT "${FASTUDY_MPI_ENV}"
                           TIMEOUT ${T_TIMEOUT} LABELS "mpi;${T_LABELS}" PROCESSORS ${n})
    endforeach()
    if(T_SINGLETON)
      add_test(NAME ${name}_singleton COMMAND ${name})
      set_tests_properties(${name}_singleton PROPERTIES ENVIRONMENT "${FASTUDY_MPI_ENV}" TIMEOUT ${T_TIMEOUT}
                           LABELS "mpi;${T_LABELS}")
    endif()
  else()
    # List-valued properties (ENVIRONMENT, LABELS) cannot go through gtest_discover_tests' PROPERTIES:
    # it splits them into separate arguments, keeping only the first element. They are set by a
    # second include file, read by ctest after the discovered tests' own, over the discovered list.
    gtest_discover_tests(${name} PROPERTIES TIMEOUT ${T_TIMEOUT} TEST_LIST ${name}_TESTS DISCOVERY_TIMEOUT 60)
    set(props ${CMAKE_CURRENT_BINARY_DIR}/${name}_properties.cmake)
    file(WRITE ${props}
         "if(${name}_TESTS)\n"
         "  set_tests_properties(\${${name}_TESTS} PROPERTIES ENVIRONMENT [==[${FASTUDY_MPI_ENV}]==]\n"
         "                      LABELS [==[${T_LABELS}]==])\n"
         "endif()\n")
    set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${props})
  endif()
endfunction()
