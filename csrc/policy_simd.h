/*
 * policy_simd: which SIMD path the policy's kernels (policy_rollout.c,
 * policy_update.c) take.
 *
 * The paths, widest first: "avx512" (x86-64-v4: 16 floats a register, 32
 * registers), "avx2" (x86-64-v3: 8 floats, 16 registers), "baseline" (the
 * architecture's own vectors of 4 floats: SSE2 on x86-64, NEON on aarch64)
 * and "plain" (the unblocked loops every compiler vectorises as it can; the
 * reference the others are checked against). Every path computes each output
 * by the same float operations in the same order (no fused multiply-adds:
 * the library is compiled with -ffp-contract=off), so all give the same bits.
 * "avx2+fma" and "avx512+fma" are those two with each product fused with its
 * sum: the same products in the same order, rounded once instead of twice, so
 * their bits differ from the others' (by a few units in the last place of a
 * layer's output) and agree with each other's.
 *
 * The default (pr_simd_default) is the widest path the CPU runs, fused where
 * that is avx2 or avx512 (fused products are faster on Intel and AMD cores
 * alike), unless the environment variable GRPO_CTRL_SIMD names another path; it
 * is read once,
 * when the library loads (or
 * at the first kernel call where the compiler has no load-time hook). A path
 * wider than the CPU runs is capped at the widest it does (keeping +fma); a name
 * that is none of the six stops the program with a one-line error and exit status 2.
 */
#ifndef POLICY_SIMD_H
#define POLICY_SIMD_H

#define PR_SIMD_PLAIN 0
#define PR_SIMD_BASELINE 1
#define PR_SIMD_AVX2 2
#define PR_SIMD_AVX512 3
#define PR_SIMD_AVX2_FMA 4
#define PR_SIMD_AVX512_FMA 5

/* The path in use: "avx512", "avx2", "baseline", "plain", "avx2+fma" or "avx512+fma". */
const char *pr_simd_path(void);

/* The path taken where GRPO_CTRL_SIMD names none: the widest this CPU runs, its
 * +fma form where that is avx2 or avx512 ("avx2+fma", "avx512+fma"). */
const char *pr_simd_default(void);

/* The exact paths this CPU and build can run, widest first, space-separated
 * (e.g. "avx512 avx2 baseline plain"); the +fma ones: pr_simd_fused_paths. */
const char *pr_simd_paths(void);

/* The fused paths this CPU and build can run, widest first ("avx512+fma avx2+fma",
 * "avx2+fma" or ""). */
const char *pr_simd_fused_paths(void);

/* What "baseline" is on this architecture: "sse2", "neon" or "generic". */
const char *pr_simd_baseline(void);

/* Takes the path `name` (capped at the widest this CPU runs) from now on.
 * Returns the PR_SIMD_* level taken, or -1 for an unknown name (nothing
 * changes). For tests and benchmarks: not while another thread runs a kernel. */
int pr_simd_select(const char *name);

/* out [nout x S] = W [nout x nin] in [nin x S] (row-major; S a multiple of 16): one
 * layer's matrix product, without bias or activation, on the path in use, for
 * benchmarks against a BLAS at the network's shapes (benchmarks/bench_kernels.py).
 * Returns 0, or -1 for sizes out of range. */
int pr_simd_product(int S, int nin, int nout, const float *W, const float *in, float *out);

#endif /* POLICY_SIMD_H */
