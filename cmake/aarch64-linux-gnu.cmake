# Cross build for 64-bit Arm Linux on an x86-64 Debian machine (scripts/build-arm64.sh):
# Debian's g++-aarch64-linux-gnu, and the libraries as :arm64 multiarch packages, found through
# their aarch64-linux-gnu directories. Built programs run under qemu-aarch64 (user mode).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# Headers and CMake packages are shared with the host (/usr/include, /usr/lib/cmake), libraries
# are the target's: search both roots for packages, but never run a host program from them.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
# pkg-config reads the target's .pc files only.
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
# ctest and gtest_discover_tests run the test binary through the emulator.
find_program(SWIFTLET_QEMU_AARCH64 NAMES qemu-aarch64 qemu-aarch64-static)
if(SWIFTLET_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${SWIFTLET_QEMU_AARCH64})
endif()
