# cmake -DBUILD_DIR=.. -DTARGET=.. -DEXPECT=fail|ok -DHEADER=.. -P expect_build.cmake
# Builds one layer probe and checks the outcome: `fail` needs a failed build that names HEADER as
# not found (so a failure for any other reason does not count); `ok` needs a successful build.
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${TARGET}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(EXPECT STREQUAL "fail")
  if(rc EQUAL 0)
    message(FATAL_ERROR "${TARGET}: including ${HEADER} built, but it is above the probe's layer:\n${out}")
  endif()
  string(FIND "${out}" "${HEADER}: No such file or directory" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${TARGET}: the build failed, but not for the missing ${HEADER}:\n${out}")
  endif()
  message(STATUS "${TARGET}: refused as expected (${HEADER}: No such file or directory)")
else()
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${TARGET}: including ${HEADER} should build:\n${out}")
  endif()
  message(STATUS "${TARGET}: built")
endif()
