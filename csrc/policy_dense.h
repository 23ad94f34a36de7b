/*
 * policy_dense: the arithmetic the policy's network shares between the
 * rollout (policy_rollout.c) and the update's gradient (policy_update.c).
 * Internal: included by those two files only, never by Python's cdef.
 *
 * Activations are structure-of-arrays: unit i of sample b at [i * S + b],
 * S a multiple of TILE, so every layer is a batch of axpys that vectorise.
 */
#ifndef POLICY_DENSE_H
#define POLICY_DENSE_H

#include <math.h>
#include <stddef.h>

/* Environments per tile: one AVX-512 register, two AVX ones, four SSE ones. */
#define TILE 16

/* Runtime dispatch (GCC >= 11 on x86-64 Linux): the kernels' plain loops are
 * compiled for AVX2 as well as for the baseline (target_clones, picked when the
 * library loads), and their register-blocked versions for AVX-512 (target
 * "x86-64-v4", picked per call by pr_v4()). The blocked versions hold 16
 * accumulators of 16 floats in GCC vector types: right for AVX-512's 32
 * registers of 16 floats, 40-50 x slower where a vector of 16 floats is not a
 * register (x86-64-v3: 812 against 14.5 us for the network of 256 branches), so
 * those targets keep the plain loops (docs/grpo.md §9, thirteenth pass).
 * Elsewhere: the plain loops only. */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 && defined(__x86_64__) && \
    defined(__linux__) && !defined(PR_NO_CLONES)
#define PR_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#define PR_V4 __attribute__((target("arch=x86-64-v4")))
#define PR_HAVE_V4 1
static inline int pr_v4(void)
{
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
}
#else
#define PR_CLONES
#define PR_HAVE_V4 0
#endif

enum { ACT_NONE = 0, ACT_RELU = 1, ACT_SIN = 2 };

/* sin(x) within ~1.2e-7 for |x| < 2^21: x reduced by the nearest multiple k pi
 * (pi in three parts, Cody and Waite), a degree-11 odd polynomial (Taylor; its
 * error at pi/2 is 6e-8), the sign flipped for odd k. Written without
 * branches, calls or float-to-int conversions so that it vectorises and stays
 * defined for any input (garbage, not UB, beyond 2^21). */
static inline float sin_reduced(float x)
{
  const float shift = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
  const float k = (x * 0.318309886183790671f + shift) - shift;
  float r = x - k * 3.140625f;
  r = r - k * 9.67502593994140625e-4f;
  r = r - k * 1.509957990978376432e-7f;
  const float half = (k * 0.5f + shift) - shift; /* k / 2 rounded: k - 2 half = +-1 iff k odd */
  const float odd = fabsf(k - 2.0f * half);
  const float r2 = r * r;
  float p = 2.5052108385441720e-08f;
  p = p * r2 - 2.7557319223985890e-06f;
  p = p * r2 + 1.9841269841269841e-04f;
  p = p * r2 - 8.3333333333333333e-03f;
  p = p * r2 + 1.6666666666666667e-01f;
  return (1.0f - 2.0f * odd) * (r - r * r2 * p);
}

static inline float activate(float v, int act)
{
  if (act == ACT_RELU) return v > 0.0f ? v : 0.0f;
  if (act == ACT_SIN) return sin_reduced(v);
  return v;
}

/* out[j][b] = act(bias[j] + sum_i W[j][i] in[i][b]) for b < S (S a multiple of
 * TILE; rows S apart). Four outputs at a time share each input load. */
PR_CLONES
static void dense_plain(int S, int nin, int nout, const float *W, const float *bias,
                        const float *in, float *out, int act)
{
  for (int b0 = 0; b0 < S; b0 += TILE) {
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

#if PR_HAVE_V4
/* Unaligned, aliasing vectors of one tile: GCC keeps locals of this type in
 * registers, where arrays of float accumulators spill to the stack. */
typedef float tile_vec __attribute__((vector_size(4 * TILE), aligned(4), may_alias));
#define VEC(p) (*(tile_vec *)(p))

/* dense_v4's block: outputs j..j+JB of tiles b0..b0+NT, each input row loaded
 * once for JB outputs and each weight once for NT tiles. JB and NT are
 * constants at every call, so the loops unroll into JB * NT accumulators. */
static inline __attribute__((always_inline)) void dense_block(int JB, int NT, int S, int b0,
                                                              int j, int nin, const float *W,
                                                              const float *bias,
                                                              const float *in, float *out,
                                                              int act)
{
  const tile_vec zero = {0.0f};
  tile_vec acc[8][2];
  for (int a = 0; a < JB; ++a)
    for (int u = 0; u < NT; ++u) acc[a][u] = zero + bias[j + a];
  for (int i = 0; i < nin; ++i) {
    const float *x = in + (size_t)i * S + b0;
    tile_vec xv[2];
    for (int u = 0; u < NT; ++u) xv[u] = VEC(x + u * TILE);
    for (int a = 0; a < JB; ++a) {
      const float w = W[(size_t)(j + a) * nin + i];
      for (int u = 0; u < NT; ++u) acc[a][u] += w * xv[u];
    }
  }
  for (int a = 0; a < JB; ++a)
    for (int u = 0; u < NT; ++u) {
      float *o = out + (size_t)(j + a) * S + b0 + u * TILE;
      VEC(o) = acc[a][u];
      for (int k = 0; k < TILE; ++k) o[k] = activate(o[k], act);
    }
}

/* dense_plain's result in blocks of 8 outputs by 2 tiles, 16 accumulators: the
 * network of 256 branches in 14.5 us against 25 (AVX-512). */
PR_V4
static void dense_v4(int S, int nin, int nout, const float *W, const float *bias,
                     const float *in, float *out, int act)
{
  int b0 = 0;
  for (; b0 + 2 * TILE <= S; b0 += 2 * TILE) {
    int j = 0;
    for (; j + 8 <= nout; j += 8) dense_block(8, 2, S, b0, j, nin, W, bias, in, out, act);
    for (; j + 4 <= nout; j += 4) dense_block(4, 2, S, b0, j, nin, W, bias, in, out, act);
    for (; j < nout; ++j) dense_block(1, 2, S, b0, j, nin, W, bias, in, out, act);
  }
  for (; b0 < S; b0 += TILE) {
    int j = 0;
    for (; j + 8 <= nout; j += 8) dense_block(8, 1, S, b0, j, nin, W, bias, in, out, act);
    for (; j + 4 <= nout; j += 4) dense_block(4, 1, S, b0, j, nin, W, bias, in, out, act);
    for (; j < nout; ++j) dense_block(1, 1, S, b0, j, nin, W, bias, in, out, act);
  }
}
#endif

static void dense(int S, int nin, int nout, const float *W, const float *bias, const float *in,
                  float *out, int act)
{
#if PR_HAVE_V4
  if (pr_v4()) {
    dense_v4(S, nin, nout, W, bias, in, out, act);
    return;
  }
#endif
  dense_plain(S, nin, nout, W, bias, in, out, act);
}

/* Rows of the activations: B rounded up to tiles, and off a multiple of 256
 * floats, where rows 1 kB apart would share the L1 cache's sets. */
static inline int stride(int B)
{
  int S = (B + TILE - 1) / TILE * TILE;
  return S % 256 == 0 ? S + TILE : S;
}

#endif /* POLICY_DENSE_H */
