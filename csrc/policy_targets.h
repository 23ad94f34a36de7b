/*
 * policy_targets: which SIMD variants of the policy's kernels this compiler
 * builds (policy_dense.h, policy_kernels.h) and the path the kernels take
 * (policy_simd.c). Internal: not part of Python's cdef.
 */
#ifndef POLICY_TARGETS_H
#define POLICY_TARGETS_H

/* x86-64 with GCC >= 11 on Linux: the plain loops are compiled for AVX2 as
 * well as for the baseline (target_clones, picked when the library loads), and
 * the register-blocked kernels for AVX-512 (target "x86-64-v4") and for AVX2
 * (target "x86-64-v3"), picked per call by the path in use (policy_simd.h).
 * -DPR_NO_CLONES builds neither: the baseline and plain paths only. */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 && defined(__x86_64__) && \
    defined(__linux__) && !defined(PR_NO_CLONES)
#define PR_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#define PR_V4 __attribute__((target("arch=x86-64-v4")))
#define PR_V3 __attribute__((target("arch=x86-64-v3")))
#define PR_HAVE_V4 1
#define PR_HAVE_V3 1
#else
#define PR_CLONES
#define PR_HAVE_V4 0
#define PR_HAVE_V3 0
#endif

/* The blocked baseline kernels use GCC's vector types (GCC and clang). */
#if defined(__GNUC__)
#define PR_HAVE_VEC 1
#else
#define PR_HAVE_VEC 0
#endif

/* The PR_SIMD_* level in use (policy_simd.c). */
int pr_simd_level(void);

#endif /* POLICY_TARGETS_H */
