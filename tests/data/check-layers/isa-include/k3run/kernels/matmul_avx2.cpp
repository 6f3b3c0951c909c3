// A per-ISA kernel file that includes a header with inline templates (the check must refuse it).
#include <immintrin.h>

#include <algorithm>
