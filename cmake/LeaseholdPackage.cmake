# The Debian package (`cpack -G DEB` in the build directory, or the `package` target):
# leasehold_<version>_amd64.deb with the command, libleasehold.so.0, the headers, the CMake
# package, leasehold.pc, the man page and the bash, zsh and fish completions. CPack rather than a debian/
# folder: the install rules above already say where every file goes, so the package cannot
# drift from `cmake --install`, and dpkg-shlibdeps (CPACK_DEBIAN_PACKAGE_SHLIBDEPS) writes
# Depends: from what the binaries really link.

install(FILES ${PROJECT_SOURCE_DIR}/docs/leasehold.1 DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
install(FILES ${PROJECT_SOURCE_DIR}/tools/cli/completion/leasehold.bash
  DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions RENAME leasehold)
install(FILES ${PROJECT_SOURCE_DIR}/tools/cli/completion/_leasehold
  DESTINATION ${CMAKE_INSTALL_DATADIR}/zsh/vendor-completions)
install(FILES ${PROJECT_SOURCE_DIR}/tools/cli/completion/leasehold.fish
  DESTINATION ${CMAKE_INSTALL_DATADIR}/fish/vendor_completions.d)
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/examples/systemd ${PROJECT_SOURCE_DIR}/examples/cron
  ${PROJECT_SOURCE_DIR}/examples/container DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples)

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME leasehold)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "leasehold maintainers <maintainers@leasehold.invalid>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
  "distributed leases with fencing tokens: library and command")
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION
  "leasehold keeps named leases in an external store (the embedded SQLite file, Redis,
PostgreSQL, etcd or ZooKeeper) with a TTL, an unguessable owner token, a heartbeat, an
owner-checked release and a monotonic fencing token. `leasehold run KEY -- CMD` runs a
command on exactly one machine and stops its whole process tree before anyone else can
take the lease. Includes the C++20 library, its headers, CMake package and pkg-config file.")
set(CPACK_DEBIAN_PACKAGE_SECTION utils)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# The command links libleasehold.so.0 from this very package: tell dpkg-shlibdeps where it is
# in the staging tree, and publish a shlibs file for packages that build against it.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${CMAKE_INSTALL_LIBDIR})
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
# postinst makes /var/lib/leasehold (1777), the directory of the host-wide default store.
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${PROJECT_SOURCE_DIR}/cmake/debian/postinst)
include(CPack)
