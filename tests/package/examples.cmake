# The service-manager examples the Debian package installs (examples/systemd, examples/cron,
# examples/container): systemd-analyze verify on the units, and every leasehold command line in
# them run for real against a throwaway sqlite:// store (hence the LEASEHOLD_WITH_SQLITE guard).
# Include this file where the leasehold_cli target exists.
if(LEASEHOLD_WITH_SQLITE)
  add_test(NAME examples_test
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/examples_test.sh $<TARGET_FILE:leasehold_cli>
            ${PROJECT_SOURCE_DIR})
  set_tests_properties(examples_test PROPERTIES LABELS package TIMEOUT 120)
endif()
