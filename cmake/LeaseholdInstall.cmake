# install(): headers, libraries, the CMake package (find_package(leasehold)) and pkg-config.
include(CMakePackageConfigHelpers)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/leasehold DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS leasehold leasehold_testing EXPORT leaseholdTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT leaseholdTargets NAMESPACE leasehold::
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/leasehold)

# leaseholdConfig.cmake finds the library's own dependencies only for a static libleasehold.
if(BUILD_SHARED_LIBS)
  set(LEASEHOLD_STATIC_LIB OFF)
else()
  set(LEASEHOLD_STATIC_LIB ON)
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/leaseholdConfig.cmake.in
  ${PROJECT_BINARY_DIR}/leaseholdConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/leasehold)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/leaseholdConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/leaseholdConfig.cmake
              ${PROJECT_BINARY_DIR}/leaseholdConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/leasehold)

# pkg-config: a static build needs the private dependencies at link time.
set(LEASEHOLD_PC_REQUIRES_PRIVATE "fmt")
if(LEASEHOLD_WITH_SQLITE)
  string(APPEND LEASEHOLD_PC_REQUIRES_PRIVATE " sqlite3")
endif()
if(LEASEHOLD_WITH_REDIS)
  string(APPEND LEASEHOLD_PC_REQUIRES_PRIVATE " hiredis openssl")
endif()
# libpq by name, not through Requires.private: Debian's libpq.pc lists, for --static, the
# libraries of a static libpq (-lpgcommon -lpgport -lgssapi_krb5...) that libpq-dev lacks, while
# a static leasehold only needs the shared libpq.
set(LEASEHOLD_PC_LIBS_PRIVATE "")
if(LEASEHOLD_WITH_POSTGRES)
  string(APPEND LEASEHOLD_PC_LIBS_PRIVATE " -lpq")
endif()
# gRPC and protobuf through Requires.private: the generated code in a static libleasehold.a
# calls absl directly (absl::Mutex), and grpc++.pc --static lists absl and the rest, all of
# which Debian ships as shared libraries (checked: a consumer links with them).
if(LEASEHOLD_WITH_ETCD)
  string(APPEND LEASEHOLD_PC_REQUIRES_PRIVATE " grpc++ protobuf")
endif()
# The ZooKeeper C client has no .pc file either: by name.
if(LEASEHOLD_WITH_ZOOKEEPER)
  string(APPEND LEASEHOLD_PC_LIBS_PRIVATE " -lzookeeper_mt")
endif()
file(RELATIVE_PATH LEASEHOLD_PC_TO_PREFIX "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
string(REGEX REPLACE "/$" "" LEASEHOLD_PC_TO_PREFIX "${LEASEHOLD_PC_TO_PREFIX}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/leasehold.pc.in ${PROJECT_BINARY_DIR}/leasehold.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/leasehold.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
