# Warning and sanitizer flags shared by every leasehold target.
add_library(leasehold_build_flags INTERFACE)
# Designated initializers leave defaulted members out on purpose (StoreOptions{.ttl = 10s}).
target_compile_options(leasehold_build_flags INTERFACE -Wall -Wextra -Wpedantic -Wno-missing-field-initializers)
if(LEASEHOLD_WERROR)
  target_compile_options(leasehold_build_flags INTERFACE -Werror)
endif()
if(LEASEHOLD_BUILD_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "LEASEHOLD_BUILD_FUZZ needs clang (libFuzzer): CXX=clang++-14")
  endif()
  if(LEASEHOLD_SANITIZE)
    message(FATAL_ERROR "LEASEHOLD_BUILD_FUZZ brings its own sanitizers: leave LEASEHOLD_SANITIZE empty")
  endif()
  # ASan + UBSan in every object: this build also runs the test suite under them
  # (scripts/test.sh). Coverage instrumentation (fuzzer-no-link) only in the library
  # (src/CMakeLists.txt), so the fuzzer sees inside the parsers and the tests' own code runs
  # without it; the fuzz targets themselves compile and link with -fsanitize=fuzzer
  # (tests/fuzz/).
  target_compile_options(leasehold_build_flags INTERFACE
    -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all)
  target_link_options(leasehold_build_flags INTERFACE -fsanitize=address,undefined)
endif()
if(LEASEHOLD_SANITIZE)
  target_compile_options(leasehold_build_flags INTERFACE
    -fsanitize=${LEASEHOLD_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  target_link_options(leasehold_build_flags INTERFACE -fsanitize=${LEASEHOLD_SANITIZE})
endif()
if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  target_compile_options(leasehold_build_flags INTERFACE -Wthread-safety -Werror=thread-safety)
endif()

# leasehold_cc_test(NAME name SRCS a.cc b.cc [DEPS ...] [LABELS ...] [ENVIRONMENT VAR=value ...])
# One gtest executable registered with CTest; tests see the internal src/ headers.
# Several LABELS ("redis;sentinel") become one label joined by '-' ("redis-sentinel"):
# gtest_discover_tests flattens a list in PROPERTIES (the second element would turn into a
# property name), and `ctest -L`/`-LE` match a label by regular expression, so -L redis and
# -LE sentinel both select "redis-sentinel".
#
# ROWS (a value-parameterized suite whose parameters are store rows, like conformance_test):
# one CTest test per row, NAME/<row>, running that row's tests in one process, instead of one
# process per test (cmake/GtestRows.cmake, at CTest time). A process per test started the
# row's servers for every test: the 637 conformance tests took 1096 s of test time, their 13
# rows (and the split case) 445 s. SPLIT names tests ("Suite.Test", without the
# instantiation prefix) that stay a CTest test of their own per row, under their gtest name.
function(leasehold_cc_test)
  cmake_parse_arguments(T "ROWS" "NAME;TIMEOUT" "SRCS;DEPS;LABELS;ENVIRONMENT;SPLIT" ${ARGN})
  add_executable(${T_NAME} ${T_SRCS})
  target_link_libraries(${T_NAME} PRIVATE leasehold_internal GTest::gtest GTest::gtest_main
                        GTest::gmock ${T_DEPS} leasehold_build_flags)
  target_include_directories(${T_NAME} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  string(REPLACE ";" "-" label "${T_LABELS}")
  if(T_ROWS)
    set(include_file "${CMAKE_CURRENT_BINARY_DIR}/${T_NAME}_rows.cmake")
    file(GENERATE OUTPUT "${include_file}" CONTENT
"set(EXE [==[$<TARGET_FILE:${T_NAME}>]==])
set(NAME [==[${T_NAME}]==])
set(LABELS [==[${label}]==])
set(SPLIT [==[${T_SPLIT}]==])
set(ENVIRONMENT [==[${T_ENVIRONMENT}]==])
include([==[${PROJECT_SOURCE_DIR}/cmake/GtestRows.cmake]==])
")
    set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${include_file}")
    return()
  endif()
  gtest_discover_tests(${T_NAME} PROPERTIES LABELS "${label}" ENVIRONMENT "${T_ENVIRONMENT}"
                       DISCOVERY_TIMEOUT 60)
endfunction()

# leasehold_store_definitions(target [PUBLIC|PRIVATE|INTERFACE])
# Defines LEASEHOLD_WITH_<OPTION>=1 on `target` for every store of LEASEHOLD_STORES built in.
function(leasehold_store_definitions target)
  set(scope PRIVATE)
  if(ARGC GREATER 1)
    set(scope ${ARGV1})
  endif()
  foreach(entry ${LEASEHOLD_STORES})
    string(REPLACE "=" ";" parts ${entry})
    list(GET parts 0 option)
    if(LEASEHOLD_WITH_${option})
      target_compile_definitions(${target} ${scope} LEASEHOLD_WITH_${option}=1)
    endif()
  endforeach()
endfunction()
