/*
 * policy_rollout: the policy's mean network and a training rollout in C
 * (policy_rollout.h). The network's arithmetic is float32, as torch's.
 */
#include "policy_rollout.h"

#include <math.h>
#include <string.h>

#include "policy_dense.h"

/* tanh(x) within 2 ulp, without branches or calls, so that the loop over the branches
 * vectorises (tanhf is a call: 8.5 ns each, 0.14 ms of the gym default's rollout).
 * |x| < 0.5: the odd Taylor series to x^17 (the next term is below 1e-9 of tanh there).
 * Beyond: (1 - t) / (1 + t) with t = e^(-2|x|) = 2^k e^r, k the nearest integer to
 * -2|x| / ln 2 (ln 2 in two parts, Cody and Waite), |r| <= ln 2 / 2 and e^r by its
 * Taylor series to r^7 (remainder 5e-9); |x| is clamped at 9, where tanh rounds to 1
 * in float, so k stays in [-26, 0]. NaN stays NaN. */
static inline float tanh_branchless(float x)
{
  const float a = fabsf(x) < 9.0f ? fabsf(x) : 9.0f; /* not fminf: it does not vectorise */
  const float a2 = a * a;
  float q = 5.9002744094558596e-04f;
  q = q * a2 - 1.4558343870513183e-03f;
  q = q * a2 + 3.5921280365724810e-03f;
  q = q * a2 - 8.8632355299021966e-03f;
  q = q * a2 + 2.1869488536155203e-02f;
  q = q * a2 - 5.3968253968253968e-02f;
  q = q * a2 + 1.3333333333333333e-01f;
  q = q * a2 - 3.3333333333333333e-01f;
  const float small = a + a * a2 * q;
  const float shift = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
  const float y = -2.0f * a;
  const float k = (y * 1.44269504088896341f + shift) - shift;
  const float r = (y - k * 0.693359375f) - k * -2.12194440e-4f;
  float p = 1.9841269841269841e-04f;
  p = p * r + 1.3888888888888889e-03f;
  p = p * r + 8.3333333333333333e-03f;
  p = p * r + 4.1666666666666667e-02f;
  p = p * r + 1.6666666666666667e-01f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = ((int32_t)k + 127) * (1 << 23); /* 2^k, k in [-26, 0] */
  float two_k;
  memcpy(&two_k, &bits, sizeof two_k);
  const float t = p * two_k;
  const float big = (1.0f - t) / (1.0f + t);
  const float out = copysignf(a < 0.5f ? small : big, x);
  return x != x ? x : out;
}

/* z = mu + spread and the command u_max tanh(z), for B branches. */
PR_CLONES
static void squash(int B, float umax, const float *mu, const float *spread, float *z,
                   float *act)
{
  for (int b = 0; b < B; ++b) {
    z[b] = mu[b] + spread[b];
    act[b] = umax * tanh_branchless(z[b]);
  }
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
  return S * ((size_t)net->nfeat + (size_t)net->nobs + 2 * (size_t)net->width + 1) + LINE_FLOATS;
}

int pr_mean(const pr_net *net, int B, const float *obs, float *mu, float *work)
{
  if (!net_ok(net) || B < 1 || !obs || !mu || !work) return PS_ERR_MODEL;
  /* nb lanes computed (B rounded up to a tile), in rows S >= nb apart (stride()) */
  const int n = net->nobs, f = net->nfeat, w = net->width, S = stride(B);
  const int nb = (B + TILE - 1) / TILE * TILE;
  const float *mean = net->params, *scale = mean + n, *p = scale + n;
  float *in = line_aligned(work);         /* (f + n) x S: features, then x */
  float *h[2] = {in + (size_t)(f + n) * S, in + (size_t)(f + n + w) * S};
  float *out = h[1] + (size_t)w * S;      /* 1 x S */
  float *x = in + (size_t)f * S;
  for (int k = 0; k < n; ++k) {
    for (int b = 0; b < B; ++b)
      x[(size_t)k * S + b] = (obs[(size_t)b * n + k] - mean[k]) * scale[k];
    for (int b = B; b < nb; ++b) x[(size_t)k * S + b] = 0.0f; /* the tile's spare lanes */
  }
  if (f) {
    dense(S, nb, n, f, p, p + (size_t)f * n, x, in, ACT_SIN);
    p += (size_t)f * n + f;
  }
  const float *layer_in = f ? in : x;
  int nin = f + n;
  for (int l = 0; l < net->nhidden; ++l) {
    dense(S, nb, nin, w, p, p + (size_t)w * nin, layer_in, h[l % 2], ACT_RELU);
    p += (size_t)w * nin + w;
    layer_in = h[l % 2];
    nin = w;
  }
  dense(S, nb, w, 1, p, p + w, layer_in, out, ACT_NONE);
  for (int b = 0; b < B; ++b) mu[b] = out[b];
  return PS_OK;
}

/* The sum of column k of x [rows * n] (about `centre`, squared when `square`): four
 * partial sums, rows i = 0, 1, 2, 3 (mod 4), so that the adds do not wait on each other. */
static double column_sum(const float *x, long rows, int n, int k, double centre, int square)
{
  double s[4] = {0.0, 0.0, 0.0, 0.0};
  long i = 0;
  for (; i + 4 <= rows; i += 4)
    for (int q = 0; q < 4; ++q) {
      const double d = (double)x[(size_t)(i + q) * n + k] - centre;
      s[q] += square ? d * d : d;
    }
  for (; i < rows; ++i) {
    const double d = (double)x[(size_t)i * n + k] - centre;
    s[i % 4] += square ? d * d : d;
  }
  return (s[0] + s[1]) + (s[2] + s[3]);
}

int pr_moments(const float *x, long rows, int n, double *out)
{
  if (!x || !out || rows < 1 || n < 1) return PS_ERR_MODEL;
  out[0] = (double)rows;
  for (int k = 0; k < n; ++k) {
    const double mean = column_sum(x, rows, n, k, 0.0, 0) / (double)rows;
    out[1 + k] = mean;
    out[1 + n + k] = column_sum(x, rows, n, k, mean, 1) / (double)rows;
  }
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
    squash(B, umax, mu + row, spread + row, z + row, act);
    for (int b = 0; b < B; ++b) {
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
