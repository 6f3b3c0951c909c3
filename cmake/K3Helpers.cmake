# k3_library(NAME SOURCES ... DEPS ...): a module library with the project's warnings.
function(k3_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
  target_compile_options(${name} PRIVATE ${K3_WARNINGS})
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
endfunction()

# k3_executable(NAME SOURCES ... DEPS ...): a thin main() over a module library.
function(k3_executable name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_compile_options(${name} PRIVATE ${K3_WARNINGS})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS})
endfunction()

# k3_test(NAME SOURCES ... DEPS ... [FIXTURES F]): one GoogleTest binary, each test registered
# with CTest. FIXTURES F (tiny, small, tiny-ref, small-ref or all; tests/support/synth_fixture.h):
# every test of the binary waits for that shared synthetic fixture, built once per CTest run.
function(k3_test name)
  cmake_parse_arguments(ARG "" "FIXTURES" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_compile_options(${name} PRIVATE ${K3_WARNINGS})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main GTest::gmock)
  target_compile_definitions(${name} PRIVATE
    K3_SOURCE_DIR="${PROJECT_SOURCE_DIR}" K3_BINARY_DIR="${PROJECT_BINARY_DIR}")
  if(ARG_FIXTURES)
    target_link_libraries(${name} PRIVATE k3_test_fixtures)
    gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60
                         PROPERTIES LABELS unit FIXTURES_REQUIRED k3_fixture_${ARG_FIXTURES})
  else()
    gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES LABELS unit)
  endif()
endfunction()

# k3_fuzz_target(NAME SOURCE ... DEPS ...): a libFuzzer entry point (LLVMFuzzerTestOneInput).
# Without K3_FUZZ it links tests/fuzz/replay_driver.cpp, which replays the committed seed corpus
# tests/fuzz/corpus/NAME/ plus deterministic mutations, and runs under CTest.
function(k3_fuzz_target name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  if(K3_FUZZ)
    add_executable(${name} ${ARG_SOURCES})
    target_link_options(${name} PRIVATE -fsanitize=fuzzer)
  else()
    add_executable(${name} ${ARG_SOURCES} ${PROJECT_SOURCE_DIR}/tests/fuzz/replay_driver.cpp)
    add_test(NAME ${name}.replay
             COMMAND ${name} ${PROJECT_SOURCE_DIR}/tests/fuzz/corpus/${name})
    set_tests_properties(${name}.replay PROPERTIES LABELS fuzz)
  endif()
  target_compile_options(${name} PRIVATE ${K3_WARNINGS})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS})
endfunction()
