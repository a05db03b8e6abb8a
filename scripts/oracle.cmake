# Included into llama.cpp's CMake project (CMAKE_PROJECT_llama.cpp_INCLUDE) when the Makefile
# builds the parity oracle, llama-cpp-python, from its sdist. Its wheel installs libllama and
# ggml (and, with LLAVA_BUILD, which the Makefile turns off, libmtmd), yet its CMakeLists
# forces llama.cpp's `common` library on, which nothing installed links: with it go
# common's ~50 C++ files and cpp-httplib, about a third of the build. The tests use the
# library only (llama_cpp's ctypes API and its Llama class).
set(LLAMA_BUILD_COMMON OFF CACHE BOOL "llama.cpp common library: not used by the oracle" FORCE)

# No AMX kernels: llama.cpp builds for the machine it is built on (GGML_NATIVE), and on a CPU
# with AMX (Sapphire Rapids and later) that compiles ggml's AMX matmuls, which crash
# (SIGSEGV in ggml_backend_amx_mul_mat) on the oracle's models on such a machine. The tests
# want llama.cpp's plain CPU path anyway (the one its noise bounds were measured on); explicit
# -mno-amx-* flags win over -march=native wherever they appear on the command line.
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$" AND CMAKE_C_COMPILER_ID MATCHES "GNU|Clang")
  add_compile_options(-mno-amx-tile -mno-amx-int8 -mno-amx-bf16)
  set(GGML_AMX_TILE OFF CACHE BOOL "no AMX in the parity oracle" FORCE)
  set(GGML_AMX_INT8 OFF CACHE BOOL "no AMX in the parity oracle" FORCE)
  set(GGML_AMX_BF16 OFF CACHE BOOL "no AMX in the parity oracle" FORCE)
endif()
