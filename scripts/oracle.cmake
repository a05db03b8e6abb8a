# Included into llama.cpp's CMake project (CMAKE_PROJECT_llama.cpp_INCLUDE) when the Makefile
# builds the parity oracle, llama-cpp-python, from its sdist. Its wheel installs libllama and
# ggml (and, with LLAVA_BUILD, which the Makefile turns off, libmtmd), yet its CMakeLists
# forces llama.cpp's `common` library on, which nothing installed links: with it go
# common's ~50 C++ files and cpp-httplib, about a third of the build. The tests use the
# library only (llama_cpp's ctypes API and its Llama class).
set(LLAMA_BUILD_COMMON OFF CACHE BOOL "llama.cpp common library: not used by the oracle" FORCE)
