// neon::matmul_rows_q8_dotprod, the NEON kernel with `sdot` (built with -march=armv8.2-a+dotprod);
// call only when cpu_has_dotprod() says so.
#include "kernels/cpu/matmul_q8_neon.h"
