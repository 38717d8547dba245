// Pass-1 instantiations of the AURA compressed decode for head dim 256 (all 16 bit pairs), in a
// translation unit of their own so the four head dims compile in parallel (see aura_pass1.cuh).
#include "aura_pass1.cuh"

namespace aura {
AURA_DEFINE_P1_FOR_DIM(256)
}  // namespace aura
