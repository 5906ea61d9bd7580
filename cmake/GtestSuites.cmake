# ctest entries for a GoogleTest executable, one per test suite and label: `<label>.<Suite>` runs
# that suite's tests of that label in one process (--gtest_filter listing them). One process per
# suite instead of one per test: a test process under the sanitizers costs ~0.7 s of CPU to start,
# and a suite's shared set-up (SetUpTestSuite, a model or tokenizer loaded once per process) is
# paid once instead of once per test.
#
#   swiftlet_gtest_suites(TARGET LABELS <label> <filter> [<label> <filter>...]
#                         WORKING_DIRECTORY <dir> [COSTS <label> <cost>...] [TIMEOUT <s>])
#
# Each filter is a --gtest_filter expression; a test belongs to the first label whose filter
# selects it. The list is made when ctest runs (and again only after the executable changed), as
# gtest_discover_tests' PRE_TEST mode does; a cross build runs the listing through its emulator.

set(_swiftlet_gtest_suites_script "${CMAKE_CURRENT_LIST_FILE}")

function(swiftlet_gtest_suites target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "WORKING_DIRECTORY;TIMEOUT" "LABELS;COSTS")
  set(base "${CMAKE_CURRENT_BINARY_DIR}/${target}_suites")
  set(emulator "")
  if(CMAKE_CROSSCOMPILING_EMULATOR)
    set(emulator "${CMAKE_CROSSCOMPILING_EMULATOR}")
  endif()
  if(NOT arg_TIMEOUT)
    set(arg_TIMEOUT 1500)
  endif()
  # The include file ctest reads: it (re)lists the tests when the executable is newer than the list.
  file(GENERATE OUTPUT "${base}_include.cmake" CONTENT
"set(exe \"$<TARGET_FILE:${target}>\")
set(list_file \"${base}_tests.cmake\")
if(NOT EXISTS \"\${list_file}\" OR \"\${exe}\" IS_NEWER_THAN \"\${list_file}\")
  execute_process(COMMAND \"${CMAKE_COMMAND}\" -D \"exe=\${exe}\" -D \"out=\${list_file}\"
    -D \"emulator=${emulator}\" -D \"labels=${arg_LABELS}\" -D \"costs=${arg_COSTS}\"
    -D \"workdir=${arg_WORKING_DIRECTORY}\" -D \"timeout=${arg_TIMEOUT}\"
    -P \"${_swiftlet_gtest_suites_script}\" RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR \"listing the tests of \${exe} failed\")
  endif()
endif()
include(\"\${list_file}\")
")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${base}_include.cmake")
endfunction()

# Script mode: list the tests of each label's filter and write one add_test per label and suite.
if(CMAKE_SCRIPT_MODE_FILE AND exe)
  set(seen "")
  set(content "")
  list(LENGTH labels n)
  math(EXPR last "${n} - 1")
  foreach(i RANGE 0 ${last} 2)
    math(EXPR j "${i} + 1")
    list(GET labels ${i} label)
    list(GET labels ${j} filter)
    set(cost 0)
    list(FIND costs "${label}" at)
    if(at GREATER -1)
      math(EXPR at "${at} + 1")
      list(GET costs ${at} cost)
    endif()
    execute_process(COMMAND ${emulator} "${exe}" --gtest_list_tests "--gtest_filter=${filter}"
                    OUTPUT_VARIABLE listing RESULT_VARIABLE rc TIMEOUT 120)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "${exe} --gtest_list_tests failed (${rc}):\n${listing}")
    endif()
    # Lines "Suite." then "  Test  # GetParam() = ..." for each of its tests.
    string(REPLACE ";" "\\;" listing "${listing}")
    string(REPLACE "\n" ";" lines "${listing}")
    set(suite "")
    set(suites "")
    foreach(line IN LISTS lines)
      if(line MATCHES "^([^ #][^ ]*)\\.$")
        set(suite "${CMAKE_MATCH_1}")
      elseif(line MATCHES "^  ([^ ]+)" AND suite)
        set(name "${suite}.${CMAKE_MATCH_1}")
        list(FIND seen "${name}" dup)
        if(dup EQUAL -1)
          list(APPEND seen "${name}")
          # Suite names may hold '/': the ctest and variable names use '_' instead.
          string(MAKE_C_IDENTIFIER "${suite}" key)
          if(NOT DEFINED tests_${key})
            list(APPEND suites "${suite}")
          endif()
          list(APPEND tests_${key} "${name}")
        endif()
      endif()
    endforeach()
    foreach(suite IN LISTS suites)
      string(MAKE_C_IDENTIFIER "${suite}" key)
      list(JOIN tests_${key} ":" only)
      unset(tests_${key})
      string(REPLACE "/" "_" test_name "${label}.${suite}")
      string(APPEND content
        "add_test([==[${test_name}]==] ${emulator} [==[${exe}]==] [==[--gtest_filter=${only}]==])\n"
        "set_tests_properties([==[${test_name}]==] PROPERTIES LABELS ${label} COST ${cost} TIMEOUT ${timeout} "
        "WORKING_DIRECTORY [==[${workdir}]==])\n")
    endforeach()
  endforeach()
  file(WRITE "${out}" "${content}")
endif()
