/*
 * policy_rollout: the policy's mean network and a training rollout in C
 * (policy_rollout.h). The network's arithmetic is float32, as torch's.
 */
#include "policy_rollout.h"

#include <math.h>

/* Environments per tile: one AVX-512 register, two AVX ones, four SSE ones. */
#define TILE 16

/* Runtime dispatch: the dense layers compiled for AVX-512 and for AVX2 as well
 * as for the baseline, the best one picked when the library loads (GCC's
 * function multiversioning; glibc's ifunc): 25 against 60 us a decision at
 * 256 branches on AVX-512 (docs/grpo.md §9, twelfth pass). Elsewhere: the
 * baseline only. */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 && defined(__x86_64__) && \
    defined(__linux__) && !defined(PR_NO_CLONES)
#define PR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define PR_CLONES
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
static void dense(int S, int nin, int nout, const float *W, const float *bias, const float *in,
                  float *out, int act)
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

/* Rows of the activations: B rounded up to tiles, and off a multiple of 256
 * floats, where rows 1 kB apart would share the L1 cache's sets. */
static int stride(int B)
{
  int S = (B + TILE - 1) / TILE * TILE;
  return S % 256 == 0 ? S + TILE : S;
}

static int net_ok(const pr_net *net)
{
  return net && net->params && net->nobs >= 1 && net->nobs <= PS_MAX_NOBS && net->nfeat >= 0 &&
         net->nhidden >= 1 && net->width >= 1;
}

size_t pr_net_num_params(const pr_net *net)
{
  if (!net_ok(net)) return 0;
  const size_t n = (size_t)net->nobs, f = (size_t)net->nfeat, w = (size_t)net->width;
  size_t count = 2 * n + (f ? f * n + f : 0);
  count += w * ((f ? f : 0) + n) + w;                    /* the first hidden layer */
  count += ((size_t)net->nhidden - 1) * (w * w + w);     /* the others */
  return count + w + 1;                                  /* the output */
}

size_t pr_work_size(const pr_net *net, int B)
{
  if (!net_ok(net) || B < 1) return 0;
  const size_t S = (size_t)stride(B);
  return S * ((size_t)net->nfeat + (size_t)net->nobs + 2 * (size_t)net->width + 1);
}

int pr_mean(const pr_net *net, int B, const float *obs, float *mu, float *work)
{
  if (!net_ok(net) || B < 1 || !obs || !mu || !work) return PS_ERR_MODEL;
  const int n = net->nobs, f = net->nfeat, w = net->width, S = stride(B);
  const float *mean = net->params, *scale = mean + n, *p = scale + n;
  float *in = work;                       /* (f + n) x S: features, then x */
  float *h[2] = {in + (size_t)(f + n) * S, in + (size_t)(f + n + w) * S};
  float *out = h[1] + (size_t)w * S;      /* 1 x S */
  float *x = in + (size_t)f * S;
  for (int k = 0; k < n; ++k) {
    for (int b = 0; b < B; ++b)
      x[(size_t)k * S + b] = (obs[(size_t)b * n + k] - mean[k]) * scale[k];
    for (int b = B; b < S; ++b) x[(size_t)k * S + b] = 0.0f; /* the tile's spare lanes */
  }
  if (f) {
    dense(S, n, f, p, p + (size_t)f * n, x, in, ACT_SIN);
    p += (size_t)f * n + f;
  }
  const float *layer_in = f ? in : x;
  int nin = f + n;
  for (int l = 0; l < net->nhidden; ++l) {
    dense(S, nin, w, p, p + (size_t)w * nin, layer_in, h[l % 2], ACT_RELU);
    p += (size_t)w * nin + w;
    layer_in = h[l % 2];
    nin = w;
  }
  dense(S, w, 1, p, p + w, layer_in, out, ACT_NONE);
  for (int b = 0; b < B; ++b) mu[b] = out[b];
  return PS_OK;
}

int pr_rollout(const ps_model *m, ps_data *d, const pr_net *net, int steps, int repeat,
               int autoreset, double u_max, double w_du, const float *spread, float *obs,
               float *raw, float *mu, float *z, double *reward, uint8_t *alive,
               float *last_act, int have_last, float *act, double *step_reward,
               uint8_t *terminated, uint8_t *truncated, float *work)
{
  if (!m || !d || !net_ok(net) || net->nobs != m->nobs || steps < 0 || repeat < 1 ||
      !(u_max > 0.0) || !spread || !obs || !raw || !mu || !z || !reward || !alive ||
      !last_act || !act || !step_reward || !terminated || !truncated || !work)
    return PS_ERR_MODEL;
  const int B = d->B, n = net->nobs;
  const float umax = (float)u_max;
  for (int t = 0; t < steps; ++t) {
    const size_t row = (size_t)t * B;
    for (size_t i = 0; i < (size_t)B * n; ++i) raw[row * n + i] = obs[i];
    int rc = pr_mean(net, B, obs, mu + row, work);
    if (rc) return rc;
    const uint8_t *was = alive + row;
    uint8_t *now = alive + row + B;
    for (int b = 0; b < B; ++b) {
      z[row + b] = mu[row + b] + spread[row + b];
      act[b] = umax * tanhf(z[row + b]);
      reward[row + b] = 0.0;
      if (w_du > 0.0 && (t > 0 || have_last) && was[b]) {
        const float du = (act[b] - last_act[b]) / umax;
        reward[row + b] -= (double)((float)w_du * (du * du));
      }
      last_act[b] = act[b];
      now[b] = was[b];
    }
    for (int k = 0; k < repeat; ++k) {
      rc = ps_step(m, d, act, obs, step_reward, terminated, truncated, autoreset, NULL);
      if (rc) return rc;
      for (int b = 0; b < B; ++b) {
        if (now[b]) reward[row + b] += step_reward[b];
        now[b] = now[b] && !terminated[b];
      }
    }
  }
  return PS_OK;
}
