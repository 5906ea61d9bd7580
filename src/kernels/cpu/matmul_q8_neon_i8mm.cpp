// neon::matmul_rows_q8_i8mm, the NEON kernel with `smmla` for batches and `sdot` for decode (built
// with -march=armv8.2-a+dotprod+i8mm); call only when cpu_has_i8mm() says so.
#include "kernels/cpu/matmul_q8_neon.h"
