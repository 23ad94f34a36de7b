/*
 * policy_kernels: the register-blocked kernels, one SIMD path per inclusion
 * (policy_dense.h includes it once per path). Before each inclusion define:
 *   K_NAME(f)   the path's name for f (dense_##f style)
 *   K_ATTR      the path's target attribute (empty for the baseline)
 *   K_VEC, K_V  its vector type (policy_dense.h) and floats in it
 *   K_DJB, K_DNT  dense's block: K_DJB outputs by K_DNT vectors of samples
 *   K_GJB, K_GIB  grad_acc's block: K_GJB outputs by K_GIB inputs
 *   K_MADD(c, a, b)  c + a b for vectors: rounded twice (the exact paths) or
 *               once, a fused multiply-add (the +fma paths)
 *   K_SPLAT(w)  the float w as K_MADD's a: w itself where a float multiplies a
 *               vector (the exact paths), else a vector of w
 * They are undefined at the end, but for the shape (K_ATTR, K_VEC, K_V and the
 * blocks) where K_KEEP_SHAPE is defined: the next inclusion (the fused kernels
 * after the exact ones) then takes the same. A block's accumulators, plus the vectors it
 * loads each step, fit the path's registers (16 for AVX2 and SSE2, 32 for
 * AVX-512 and NEON).
 *
 * Each exact kernel gives its plain loop's result (dense_plain, grad_acc_plain in
 * policy_dense.h) bit for bit: every lane of every output sees the same
 * products added in the same order; only which lanes share a register, and
 * which outputs share a load, differ. A fused one adds the same products in the
 * same order, each rounded once with its sum.
 */

/* dense's remainder blocks of 4 outputs fit its accumulators */
typedef char K_NAME(block_fits)[K_DJB >= 4 ? 1 : -1];

/* Outputs j..j+JB of vectors b0..b0+NT*V: each input vector loaded once for JB
 * outputs and each weight once for NT vectors. JB and NT are constants at every
 * call, so the loops unroll into JB * NT accumulators in registers. */
static inline __attribute__((always_inline)) K_ATTR void K_NAME(dense_block)(
    int JB, int NT, int S, int b0, int j, int nin, const float *W, const float *bias,
    const float *in, float *out)
{
  const K_VEC zero = {0.0f};
  K_VEC acc[K_DJB][K_DNT];
  for (int a = 0; a < JB; ++a)
    for (int u = 0; u < NT; ++u) acc[a][u] = zero + bias[j + a];
  for (int i = 0; i < nin; ++i) {
    const float *x = in + (size_t)i * S + b0;
    K_VEC xv[K_DNT];
    for (int u = 0; u < NT; ++u) xv[u] = *(const K_VEC *)(x + u * K_V);
    for (int a = 0; a < JB; ++a) {
      const float w = W[(size_t)(j + a) * nin + i];
      for (int u = 0; u < NT; ++u) acc[a][u] = K_MADD(acc[a][u], K_SPLAT(w), xv[u]);
    }
  }
  for (int a = 0; a < JB; ++a)
    for (int u = 0; u < NT; ++u) *(K_VEC *)(out + (size_t)(j + a) * S + b0 + u * K_V) = acc[a][u];
}

/* The activation of outputs 0..nout, samples b0..b0+n: one loop per activation,
 * so that each vectorises (the sine a vector at a time, not a lane at a time). */
static inline __attribute__((always_inline)) K_ATTR void K_NAME(activate_block)(
    int n, int S, int b0, int nout, float *out, int act)
{
  for (int j = 0; j < nout; ++j) {
    float *o = out + (size_t)j * S + b0;
    if (act == ACT_SIN)
      for (int k = 0; k < n; ++k) o[k] = sin_reduced(o[k]);
    else if (act == ACT_RELU)
      for (int k = 0; k < n; ++k) o[k] = o[k] > 0.0f ? o[k] : 0.0f;
  }
}

/* Every output for samples b0..b0+NT*V: blocks of K_DJB outputs, then 4, then 1; then
 * their activation. */
static inline __attribute__((always_inline)) K_ATTR void K_NAME(dense_lanes)(
    int NT, int S, int b0, int nin, int nout, const float *W, const float *bias,
    const float *in, float *out, int act)
{
  int j = 0;
  for (; j + K_DJB <= nout; j += K_DJB)
    K_NAME(dense_block)(K_DJB, NT, S, b0, j, nin, W, bias, in, out);
  for (; j + 4 <= nout; j += 4) K_NAME(dense_block)(4, NT, S, b0, j, nin, W, bias, in, out);
  for (; j < nout; ++j) K_NAME(dense_block)(1, NT, S, b0, j, nin, W, bias, in, out);
  K_NAME(activate_block)(NT * K_V, S, b0, nout, out, act);
}

/* dense_plain's result: K_DNT vectors of samples at a time, then 2 (AVX2's 256 branches
 * are ten blocks of 3 vectors and 2 left), then 1. */
K_ATTR PR_NOINLINE static void K_NAME(dense)(int S, int nb, int nin, int nout, const float *W,
                                             const float *bias, const float *in, float *out,
                                             int act)
{
  int b0 = 0;
  for (; b0 + K_DNT * K_V <= nb; b0 += K_DNT * K_V)
    K_NAME(dense_lanes)(K_DNT, S, b0, nin, nout, W, bias, in, out, act);
  for (; K_DNT > 2 && b0 + 2 * K_V <= nb; b0 += 2 * K_V)
    K_NAME(dense_lanes)(2, S, b0, nin, nout, W, bias, in, out, act);
  for (; b0 < nb; b0 += K_V) K_NAME(dense_lanes)(1, S, b0, nin, nout, W, bias, in, out, act);
}

/* Lanes h..h+V of every tile: gacc[(j * nin + i) * TILE + h + k] += sum over the
 * tiles t of dy[j][t + h + k] x[i][t + h + k] for outputs j..j+JB, inputs i..i+IB. */
static inline __attribute__((always_inline)) K_ATTR void K_NAME(grad_block)(
    int JB, int IB, int S, int n, int h, int j, int i, int nin, const float *dy, const float *x,
    float *gacc)
{
  float *g = gacc + ((size_t)j * nin + i) * TILE + h;
  const float *d = dy + (size_t)j * S + h;
  const float *xi = x + (size_t)i * S + h;
  K_VEC acc[K_GJB][K_GIB];
  for (int a = 0; a < JB; ++a)
    for (int c = 0; c < IB; ++c) acc[a][c] = *(K_VEC *)(g + ((size_t)a * nin + c) * TILE);
  for (int t = 0; t < n; t += TILE) {
    K_VEC dv[K_GJB], xv[K_GIB];
    for (int a = 0; a < JB; ++a) dv[a] = *(const K_VEC *)(d + (size_t)a * S + t);
    for (int c = 0; c < IB; ++c) xv[c] = *(const K_VEC *)(xi + (size_t)c * S + t);
    for (int a = 0; a < JB; ++a)
      for (int c = 0; c < IB; ++c) acc[a][c] = K_MADD(acc[a][c], dv[a], xv[c]);
  }
  for (int a = 0; a < JB; ++a)
    for (int c = 0; c < IB; ++c) *(K_VEC *)(g + ((size_t)a * nin + c) * TILE) = acc[a][c];
}

/* Outputs j..j+JB (JB < K_GJB) against every input: blocks of K_GIB inputs, then 1. */
static inline __attribute__((always_inline)) K_ATTR void K_NAME(grad_rows)(
    int JB, int S, int n, int j, int nin, const float *dy, const float *x, float *gacc)
{
  int i = 0;
  for (; i + K_GIB <= nin; i += K_GIB)
    for (int h = 0; h < TILE; h += K_V)
      K_NAME(grad_block)(JB, K_GIB, S, n, h, j, i, nin, dy, x, gacc);
  for (; i < nin; ++i)
    for (int h = 0; h < TILE; h += K_V) K_NAME(grad_block)(JB, 1, S, n, h, j, i, nin, dy, x, gacc);
}

/* grad_acc_plain's sums (n samples, a multiple of TILE, rows S apart), in blocks of K_GJB
 * outputs by K_GIB inputs, one vector of each tile's lanes at a time. */
K_ATTR PR_NOINLINE static void K_NAME(grad_acc)(int S, int n, int nin, int nout, const float *dy,
                                                const float *x, float *gacc, float *gbacc)
{
  for (int j = 0; j < nout; ++j)
    for (int h = 0; h < TILE; h += K_V) {
      K_VEC sum = *(K_VEC *)(gbacc + (size_t)j * TILE + h);
      for (int t = 0; t < n; t += TILE) sum += *(const K_VEC *)(dy + (size_t)j * S + t + h);
      *(K_VEC *)(gbacc + (size_t)j * TILE + h) = sum;
    }
  int j = 0;
  for (; j + K_GJB <= nout; j += K_GJB) {
    int i = 0;
    for (; i + K_GIB <= nin; i += K_GIB)
      for (int h = 0; h < TILE; h += K_V)
        K_NAME(grad_block)(K_GJB, K_GIB, S, n, h, j, i, nin, dy, x, gacc);
    for (; i < nin; ++i)
      for (int h = 0; h < TILE; h += K_V)
        K_NAME(grad_block)(K_GJB, 1, S, n, h, j, i, nin, dy, x, gacc);
  }
  /* the last nout % K_GJB outputs (AVX2's 32 = 10 x 3 + 2) in one block of that many rows,
   * not row by row, where a single accumulator waits on its own adds (~2 % of an AVX2
   * update) */
  switch (nout - j) {
  case 3: if (K_GJB > 3) K_NAME(grad_rows)(3, S, n, j, nin, dy, x, gacc); break;
  case 2: if (K_GJB > 2) K_NAME(grad_rows)(2, S, n, j, nin, dy, x, gacc); break;
  case 1: K_NAME(grad_rows)(1, S, n, j, nin, dy, x, gacc); break;
  default: break;
  }
}

#undef K_NAME
#undef K_MADD
#undef K_SPLAT
#ifndef K_KEEP_SHAPE
#undef K_ATTR
#undef K_VEC
#undef K_V
#undef K_DJB
#undef K_DNT
#undef K_GJB
#undef K_GIB
#endif
#undef K_KEEP_SHAPE
