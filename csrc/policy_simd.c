/*
 * policy_simd: the kernels' SIMD path (policy_simd.h).
 */
#include "policy_simd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "policy_dense.h"
#include "policy_targets.h"

static const char *const NAMES[] = {"plain", "baseline", "avx2", "avx512", "avx2+fma",
                                     "avx512+fma"};
#define NPATHS 6

/* The widest level this CPU and build run. */
static int widest(void)
{
#if PR_HAVE_V3
  __builtin_cpu_init(); /* this may run before libgcc's own constructor */
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq"))
    return PR_SIMD_AVX512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2"))
    return PR_SIMD_AVX2;
#endif
  return PR_HAVE_VEC ? PR_SIMD_BASELINE : PR_SIMD_PLAIN;
}

/* The path taken by default: the widest, fused where it is AVX2 or wider (every such
 * CPU here has FMA: widest). An Intel core multiplies and adds on the same two ports,
 * so a fused product takes half the issue slots (0.8x an iteration on a Xeon); an AMD
 * Zen 3 core adds on pipes of its own, and the fused kernels still take 0.74-0.86x the
 * exact ones' time there (0.83-0.94x an iteration; docs/grpo.md). */
static int preferred(void)
{
  const int top = widest();
#if PR_HAVE_V3
  if (top >= PR_SIMD_AVX2) return top + 2;
#endif
  return top;
}

static int parse(const char *name)
{
  for (int l = 0; l < NPATHS; ++l)
    if (strcmp(name, NAMES[l]) == 0) return l;
  return -1;
}

/* Level l capped at the widest the CPU runs, top; a fused one stays fused where its
 * exact width is avx2 or wider (every CPU with AVX2 here has FMA: widest). */
static int capped(int l, int top)
{
  const int fused = l >= PR_SIMD_AVX2_FMA, width = fused ? l - 2 : l;
  const int w = width < top ? width : top;
  return fused && w >= PR_SIMD_AVX2 ? w + 2 : w;
}

static int level = -1;

static int from_env(void)
{
  const int top = widest();
  const char *s = getenv("GRPO_CTRL_SIMD");
  if (!s || !*s) return preferred();
  const int l = parse(s);
  if (l < 0) {
    fprintf(stderr, "error: GRPO_CTRL_SIMD=%.40s is not a SIMD path; this CPU runs: %s%s%s\n",
            s, pr_simd_paths(), *pr_simd_fused_paths() ? " " : "", pr_simd_fused_paths());
    exit(2);
  }
  return capped(l, top);
}

int pr_simd_level(void)
{
  if (level < 0) level = from_env();
  return level;
}

#if defined(__GNUC__)
/* Read when the library loads, before any thread can call a kernel. */
__attribute__((constructor)) static void read_env(void) { (void)pr_simd_level(); }
#endif

const char *pr_simd_path(void) { return NAMES[pr_simd_level()]; }

const char *pr_simd_default(void) { return NAMES[preferred()]; }

const char *pr_simd_paths(void)
{
  static const char *const LISTS[] = {"plain", "baseline plain", "avx2 baseline plain",
                                      "avx512 avx2 baseline plain"};
  return LISTS[widest()];
}

const char *pr_simd_fused_paths(void)
{
  static const char *const LISTS[] = {"", "", "avx2+fma", "avx512+fma avx2+fma"};
  return LISTS[widest()];
}

const char *pr_simd_baseline(void)
{
#if defined(__x86_64__)
  return "sse2";
#elif defined(__aarch64__)
  return "neon";
#else
  return "generic";
#endif
}

int pr_simd_select(const char *name)
{
  const int l = name ? parse(name) : -1;
  if (l < 0) return -1;
  level = capped(l, widest());
  return level;
}

int pr_simd_product(int S, int nin, int nout, const float *W, const float *in, float *out)
{
  static const float zeros[1024];
  if (S < TILE || S % TILE || nin < 1 || nout < 1 || nout > 1024 || !W || !in || !out) return -1;
  dense(S, S, nin, nout, W, zeros, in, out, ACT_NONE);
  return 0;
}
