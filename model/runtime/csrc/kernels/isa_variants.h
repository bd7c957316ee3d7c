// The file ISA_VARIANTS_OF names (a part under kernels/), compiled three times: for AVX-512 (x86-64-v4), AVX2 with
// FMA (x86-64-v3) and plain x86-64, each copy in its own namespace; CPU_ISA_DISPATCH (common.h) calls the copy of
// the level in force. No include guard: included once per part.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4")
#endif
namespace isa_v4 {
#include ISA_VARIANTS_OF
}  // namespace isa_v4
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v3")
#endif
namespace isa_v3 {
#include ISA_VARIANTS_OF
}  // namespace isa_v3
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#pragma GCC pop_options
#endif
namespace isa_v1 {
#include ISA_VARIANTS_OF
}  // namespace isa_v1
