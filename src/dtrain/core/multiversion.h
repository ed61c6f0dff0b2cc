// DTRAIN_MULTIVERSION compiles a loop for AVX-512, AVX2 and baseline x86-64 and picks
// one when the program loads. The choice goes through an ifunc resolver that the dynamic
// loader runs before ThreadSanitizer's runtime is up, which crashes TSan builds; they
// get one portable version.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define DTRAIN_MULTIVERSION
#else
#define DTRAIN_MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
