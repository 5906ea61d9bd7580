// The NEON int8-activation kernel for every aarch64 CPU, neon::matmul_rows_q8: widening multiplies
// (this file is built for the baseline Armv8-A).
#include "kernels/cpu/matmul_q8_neon.h"
