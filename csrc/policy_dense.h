/*
 * policy_dense: the arithmetic the policy's network shares between the
 * rollout (policy_rollout.c) and the update's gradient (policy_update.c).
 * Internal: included by those two files and policy_simd.c (pr_simd_product)
 * only, never by Python's cdef.
 *
 * Activations are structure-of-arrays: unit i of sample b at [i * S + b],
 * S a multiple of TILE, so every layer is a batch of axpys that vectorise.
 */
#ifndef POLICY_DENSE_H
#define POLICY_DENSE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Environments per tile: one AVX-512 register, two AVX ones, four SSE ones. */
#define TILE 16

#include "policy_simd.h"
#include "policy_targets.h"

#if PR_HAVE_V3
#include <immintrin.h> /* the +fma paths' fused multiply-adds */
#endif

#if defined(__GNUC__)
#define PR_UNUSED __attribute__((unused))
#define PR_NOINLINE __attribute__((noinline))
#else
#define PR_UNUSED
#define PR_NOINLINE
#endif

enum { ACT_NONE = 0, ACT_RELU = 1, ACT_SIN = 2 };

/* sin(x) within 1.4e-7 of the exact sine for |x| < 1024 and 1e-6 for |x| < 2^16
 * (2^24 random points each; the error grows with |x| beyond, as the reduction's
 * does; Horner's degree-11 Taylor, used before, 1.7e-7 and 1e-6): x reduced by the
 * nearest multiple k pi (pi in three parts, Cody and Waite), then r + r^3 P(r^2)
 * with P the degree-3 minimax fit of (sin r - r) / r^3 on |r| <= pi/2 (Remez, its
 * own error 2.9e-8), evaluated by Estrin's scheme, and the sign flipped for odd
 * k by k's parity bit. Written without branches or calls so that it vectorises;
 * defined for any input (garbage, not UB, beyond 2^22 pi). The short dependency
 * chain is the point: the sine is a third of the rollout network's time, and a
 * core runs it at the speed its chain allows (9.5 against 14.3 cycles a vector of
 * 8 for Horner's degree-11 Taylor on a Zen 4). */
static inline float sin_reduced(float x)
{
  const float shift = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
  const float t = x * 0.318309886183790671f + shift; /* k + shift: its last bit is k's parity */
  const float k = t - shift;
  float r = x - k * 3.140625f;
  r = r - k * 9.67502593994140625e-4f;
  r = r - k * 1.509957990978376432e-7f;
  const float y = r * r, y2 = y * y;
  const float p = (-1.666666567325592e-01f + 8.333257399499416e-03f * y) +
                  y2 * (-1.9823451293632388e-04f + 2.634848669913481e-06f * y);
  float s = r + r * y * p;
  uint32_t tb, sb;
  memcpy(&tb, &t, sizeof tb);
  memcpy(&sb, &s, sizeof sb);
  sb ^= tb << 31;
  memcpy(&s, &sb, sizeof s);
  return s;
}

static inline float activate(float v, int act)
{
  if (act == ACT_RELU) return v > 0.0f ? v : 0.0f;
  if (act == ACT_SIN) return sin_reduced(v);
  return v;
}

/* out[j][b] = act(bias[j] + sum_i W[j][i] in[i][b]) for b < nb (nb a multiple of
 * TILE; rows S >= nb apart, so that a batch's spare lanes cost nothing). Four
 * outputs at a time share each input load. */
PR_CLONES PR_UNUSED
static void dense_plain(int S, int nb, int nin, int nout, const float *W, const float *bias,
                        const float *in, float *out, int act)
{
  for (int b0 = 0; b0 < nb; b0 += TILE) {
    int j = 0;
    for (; j + 4 <= nout; j += 4) {
      const float *w0 = W + (size_t)j * nin, *w1 = w0 + nin, *w2 = w1 + nin, *w3 = w2 + nin;
      float a0[TILE], a1[TILE], a2[TILE], a3[TILE];
      for (int k = 0; k < TILE; ++k) {
        a0[k] = bias[j];
        a1[k] = bias[j + 1];
        a2[k] = bias[j + 2];
        a3[k] = bias[j + 3];
      }
      for (int i = 0; i < nin; ++i) {
        const float *x = in + (size_t)i * S + b0;
        for (int k = 0; k < TILE; ++k) {
          a0[k] += w0[i] * x[k];
          a1[k] += w1[i] * x[k];
          a2[k] += w2[i] * x[k];
          a3[k] += w3[i] * x[k];
        }
      }
      float *o = out + (size_t)j * S + b0;
      for (int k = 0; k < TILE; ++k) {
        o[k] = activate(a0[k], act);
        o[k + S] = activate(a1[k], act);
        o[k + 2 * (size_t)S] = activate(a2[k], act);
        o[k + 3 * (size_t)S] = activate(a3[k], act);
      }
    }
    for (; j < nout; ++j) {
      const float *w = W + (size_t)j * nin;
      float a[TILE];
      for (int k = 0; k < TILE; ++k) a[k] = bias[j];
      for (int i = 0; i < nin; ++i) {
        const float *x = in + (size_t)i * S + b0;
        for (int k = 0; k < TILE; ++k) a[k] += w[i] * x[k];
      }
      float *o = out + (size_t)j * S + b0;
      for (int k = 0; k < TILE; ++k) o[k] = activate(a[k], act);
    }
  }
}

/* grad_acc_plain's sums for n samples (a multiple of TILE) in rows S >= n apart:
 * gacc[(j * nin + i) * TILE + k] += sum over the tiles t of dy[j][t + k] x[i][t + k],
 * gbacc[j * TILE + k] += that of dy[j][t + k]: lane by lane, so no horizontal sums
 * until the end (pu_gradient). Four outputs at a time share each input load. */
PR_CLONES PR_UNUSED
static void grad_acc_plain(int S, int n, int nin, int nout, const float *dy, const float *x,
                           float *gacc, float *gbacc)
{
  for (int j = 0; j < nout; ++j) {
    float *gb = gbacc + (size_t)j * TILE;
    const float *d = dy + (size_t)j * S;
    for (int t = 0; t < n; t += TILE)
      for (int k = 0; k < TILE; ++k) gb[k] += d[t + k];
  }
  int j = 0;
  for (; j + 4 <= nout; j += 4) {
    const float *d0 = dy + (size_t)j * S, *d1 = d0 + S, *d2 = d1 + S, *d3 = d2 + S;
    for (int i = 0; i < nin; ++i) {
      const float *xi = x + (size_t)i * S;
      float *g0 = gacc + ((size_t)j * nin + i) * TILE, *g1 = g0 + (size_t)nin * TILE,
            *g2 = g1 + (size_t)nin * TILE, *g3 = g2 + (size_t)nin * TILE;
      float a0[TILE], a1[TILE], a2[TILE], a3[TILE];
      for (int k = 0; k < TILE; ++k) {
        a0[k] = g0[k];
        a1[k] = g1[k];
        a2[k] = g2[k];
        a3[k] = g3[k];
      }
      for (int t = 0; t < n; t += TILE)
        for (int k = 0; k < TILE; ++k) {
          const float v = xi[t + k];
          a0[k] += d0[t + k] * v;
          a1[k] += d1[t + k] * v;
          a2[k] += d2[t + k] * v;
          a3[k] += d3[t + k] * v;
        }
      for (int k = 0; k < TILE; ++k) {
        g0[k] = a0[k];
        g1[k] = a1[k];
        g2[k] = a2[k];
        g3[k] = a3[k];
      }
    }
  }
  for (; j < nout; ++j) {
    const float *d = dy + (size_t)j * S;
    for (int i = 0; i < nin; ++i) {
      const float *xi = x + (size_t)i * S;
      float *g = gacc + ((size_t)j * nin + i) * TILE;
      for (int t = 0; t < n; t += TILE)
        for (int k = 0; k < TILE; ++k) g[k] += d[t + k] * xi[t + k];
    }
  }
}

/* The register-blocked kernels (policy_kernels.h), one set per path. Their
 * vectors: unaligned and aliasing, which GCC keeps in registers where arrays of
 * float accumulators spill to the stack. Measured on an AMD EPYC (Zen 4) for the
 * gym default's network on 256 branches: benchmarks/bench_kernels.py. */
#if PR_HAVE_VEC
typedef float pr_vec4 __attribute__((vector_size(16), aligned(4), may_alias));

/* baseline: vectors of 4 floats; 6 x 4 accumulators and 4 x 4 in NEON's 32
 * registers (chosen to fill them, not measured: no aarch64 machine was at hand, and
 * times under qemu mean nothing); on SSE2's 16, 4 x 4 and 2 x 4 (the fastest of 6 x 2, 4 x 2, 4 x 4 and
 * 8 x 1 for dense, 3 x 3, 2 x 2, 2 x 4 and 4 x 2 for grad_acc, in the update) */
#define K_NAME(f) f##_base
#define K_ATTR PR_UNUSED
#define K_VEC pr_vec4
#define K_V 4
#if defined(__aarch64__)
#define K_DJB 6
#define K_DNT 4
#define K_GJB 4
#define K_GIB 4
#else
#define K_DJB 4
#define K_DNT 4
#define K_GJB 2
#define K_GIB 4
#endif
#define K_MADD(c, a, b) ((c) + (a) * (b))
#define K_SPLAT(w) (w)
#include "policy_kernels.h"
#endif

#if PR_HAVE_V3
typedef float pr_vec8 __attribute__((vector_size(32), aligned(4), may_alias));

/* avx2: vectors of 8 floats (half a tile), 4 x 3 and 3 x 3 accumulators of 16 registers
 * (dense: 6 x 2 and 4 x 2 were 10 % slower over the network, 30 % on its 32 x 32 layer,
 * whose 32 outputs 6 x 2 leaves two single-output blocks; grad_acc: 4 x 2 the same,
 * 2 x 2 and 2 x 4 5-20% slower) */
#define K_NAME(f) f##_v3
#define K_ATTR PR_V3 PR_UNUSED
#define K_VEC pr_vec8
#define K_V 8
#define K_DJB 4
#define K_DNT 3
#define K_GJB 3
#define K_GIB 3
#define K_MADD(c, a, b) ((c) + (a) * (b))
#define K_SPLAT(w) (w)
#define K_KEEP_SHAPE
#include "policy_kernels.h"

/* avx2+fma: the same blocks, each product fused with its sum */
#define K_NAME(f) f##_v3f
#define K_MADD(c, a, b) ((pr_vec8)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))
#define K_SPLAT(w) _mm256_set1_ps(w)
#include "policy_kernels.h"
#endif

#if PR_HAVE_V4
typedef float pr_vec16 __attribute__((vector_size(64), aligned(4), may_alias));

/* avx512: vectors of 16 floats (a tile), 4 x 4 and 4 x 4 accumulators of 32 registers
 * (dense: 8 x 2 was 11 % slower over the network on a Zen 4, 6 x 4 and 8 x 3 the same as
 * 4 x 4 within 3 %) */
#define K_NAME(f) f##_v4
#define K_ATTR PR_V4 PR_UNUSED
#define K_VEC pr_vec16
#define K_V 16
#define K_DJB 4
#define K_DNT 4
#define K_GJB 4
#define K_GIB 4
#define K_MADD(c, a, b) ((c) + (a) * (b))
#define K_SPLAT(w) (w)
#define K_KEEP_SHAPE
#include "policy_kernels.h"

/* avx512+fma: the same blocks, each product fused with its sum */
#define K_NAME(f) f##_v4f
#define K_MADD(c, a, b) ((pr_vec16)_mm512_fmadd_ps((__m512)(a), (__m512)(b), (__m512)(c)))
#define K_SPLAT(w) _mm512_set1_ps(w)
#include "policy_kernels.h"
#endif

/* out[j][b] = act(bias[j] + sum_i W[j][i] in[i][b]) for b < nb (rows S apart), on the
 * path in use. */
static inline void dense(int S, int nb, int nin, int nout, const float *W, const float *bias,
                         const float *in, float *out, int act)
{
  switch (pr_simd_level()) {
#if PR_HAVE_V4
  case PR_SIMD_AVX512: dense_v4(S, nb, nin, nout, W, bias, in, out, act); return;
  case PR_SIMD_AVX512_FMA: dense_v4f(S, nb, nin, nout, W, bias, in, out, act); return;
#endif
#if PR_HAVE_V3
  case PR_SIMD_AVX2: dense_v3(S, nb, nin, nout, W, bias, in, out, act); return;
  case PR_SIMD_AVX2_FMA: dense_v3f(S, nb, nin, nout, W, bias, in, out, act); return;
#endif
#if PR_HAVE_VEC
  case PR_SIMD_BASELINE: dense_base(S, nb, nin, nout, W, bias, in, out, act); return;
#endif
  default: dense_plain(S, nb, nin, nout, W, bias, in, out, act);
  }
}

/* grad_acc_plain's sums on the path in use. */
static inline void grad_acc(int S, int n, int nin, int nout, const float *dy, const float *x,
                            float *gacc, float *gbacc)
{
  switch (pr_simd_level()) {
#if PR_HAVE_V4
  case PR_SIMD_AVX512: grad_acc_v4(S, n, nin, nout, dy, x, gacc, gbacc); return;
  case PR_SIMD_AVX512_FMA: grad_acc_v4f(S, n, nin, nout, dy, x, gacc, gbacc); return;
#endif
#if PR_HAVE_V3
  case PR_SIMD_AVX2: grad_acc_v3(S, n, nin, nout, dy, x, gacc, gbacc); return;
  case PR_SIMD_AVX2_FMA: grad_acc_v3f(S, n, nin, nout, dy, x, gacc, gbacc); return;
#endif
#if PR_HAVE_VEC
  case PR_SIMD_BASELINE: grad_acc_base(S, n, nin, nout, dy, x, gacc, gbacc); return;
#endif
  default: grad_acc_plain(S, n, nin, nout, dy, x, gacc, gbacc);
  }
}

/* Floats in a 64-byte cache line: what a workspace holds beyond what its parts take
 * (room to start them on a line), and what each part is rounded up to. */
#define LINE_FLOATS 16

/* p rounded up to a cache line. Every activation row then starts on one (rows are
 * whole tiles apart), so that no vector load straddles two: a workspace off by 16
 * bytes cost an update 13 % on a Zen 4. p is a float's address, so at most
 * LINE_FLOATS - 1 floats are skipped. */
static inline float *line_aligned(float *p)
{
  const size_t line = LINE_FLOATS * sizeof(float);
  return p + ((line - (uintptr_t)p % line) % line) / sizeof(float);
}

/* Rows of the activations: B rounded up to tiles, and off a multiple of 256
 * floats, where rows 1 kB apart would share the L1 cache's sets. */
static inline int stride(int B)
{
  int S = (B + TILE - 1) / TILE * TILE;
  return S % 256 == 0 ? S + TILE : S;
}

#endif /* POLICY_DENSE_H */
