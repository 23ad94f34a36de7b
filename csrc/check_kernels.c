/*
 * Checks the policy's kernels on every SIMD path this CPU runs
 * (policy_simd.h) against each other and against a double-precision
 * reference written out here:
 *   pr_mean (the rollout's network) and pu_gradient (the update's gradient)
 *   on networks of the gym default's shape (64 Fourier features, 2 x 32 ReLU)
 *   and of odd shapes (widths and batches off every block size), each path's
 *   results bit for bit those of the "plain" path; the means within 1e-5 of
 *   the largest |mean| of the double reference's, every weight's gradient
 *   within 1e-4 of the largest |gradient| (float32 sums of 4,096 terms).
 * Prints one line per network and path with a 64-bit digest of the results
 * (FNV-1a of their bytes, so that two machines' results can be compared bit
 * for bit), then "ok N" (values checked), or names the first failure and
 * exits 1. With --time, also prints microseconds per call on each path.
 * tests/test_policy_update.py builds it for this CPU, tests/test_cross_aarch64.py
 * for aarch64 under qemu-user.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "policy_rollout.h"
#include "policy_simd.h"
#include "policy_update.h"

#include "check_rng.h"

static void fill(float *a, size_t n, double lo, double hi)
{
  for (size_t i = 0; i < n; ++i) a[i] = (float)uniform(lo, hi);
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
  const unsigned char *c = p;
  for (size_t i = 0; i < n; ++i) h = (h ^ c[i]) * 0x100000001B3ull;
  return h;
}

static double now(void) { return (double)clock() / CLOCKS_PER_SEC; }

typedef struct {
  int nobs, nfeat, nhidden, width, B; /* B: rollout batch; the update's minibatch is 4096 steps */
} shape;

enum { L = 32, NROWS = 128, NBR = 2 * NROWS, MAXP = 20000, MAXH = 3 };

/* The network's parameters in pr_net's layout, and pu_net's views of them. */
typedef struct {
  shape s;
  float params[MAXP];
  pr_net pr;
  pu_net pu;
  float grads[MAXP];
} network;

static int make(network *n, shape s)
{
  memset(n, 0, sizeof *n);
  n->s = s;
  n->pr = (pr_net){.nobs = s.nobs, .nfeat = s.nfeat, .nhidden = s.nhidden, .width = s.width,
                   .params = n->params};
  const size_t np = pr_net_num_params(&n->pr);
  if (np == 0 || np > MAXP || s.nhidden > MAXH) return 0;
  float *p = n->params;
  for (int k = 0; k < s.nobs; ++k) {
    p[k] = (float)uniform(-0.5, 0.5);             /* obs mean */
    p[s.nobs + k] = (float)uniform(0.5, 2.0);     /* obs scale */
  }
  p += 2 * s.nobs;
  /* pu_net takes FourierFeatures.B as [nobs x nfeat]; pr_net its transpose: kept apart */
  static float feat_B[64 * 8];
  if (s.nfeat) {
    fill(p, (size_t)s.nfeat * s.nobs, -3.0, 3.0);
    for (int j = 0; j < s.nfeat; ++j)
      for (int k = 0; k < s.nobs; ++k) feat_B[k * s.nfeat + j] = p[j * s.nobs + k];
    n->pu.feat_B = feat_B;
    p += s.nfeat * s.nobs;
    fill(p, (size_t)s.nfeat, 0.0, 6.28);
    n->pu.feat_b = p;
    p += s.nfeat;
  }
  n->pu.nobs = s.nobs;
  n->pu.nfeat = s.nfeat;
  n->pu.nhidden = s.nhidden;
  n->pu.width = s.width;
  float *g = n->grads;
  for (int l = 0; l <= s.nhidden; ++l) {
    const int in = l == 0 ? s.nfeat + s.nobs : s.width, out = l == s.nhidden ? 1 : s.width;
    const double a = 1.7 / sqrt((double)in);
    fill(p, (size_t)out * in, -a, a);
    n->pu.W[l] = p;
    n->pu.gW[l] = g;
    p += out * in;
    g += out * in;
    fill(p, (size_t)out, -0.3, 0.3);
    n->pu.b[l] = p;
    n->pu.gb[l] = g;
    p += out;
    g += out;
  }
  return 1;
}

/* The mean in double, straight from the definitions (policy_rollout.h). */
static double ref_mean(const network *n, const float *obs)
{
  const shape s = n->s;
  const float *p = n->params;
  double x[8], a[80], h[80];
  for (int k = 0; k < s.nobs; ++k) x[k] = ((double)obs[k] - p[k]) * p[s.nobs + k];
  p += 2 * s.nobs;
  int nin = 0;
  if (s.nfeat) {
    for (int j = 0; j < s.nfeat; ++j) {
      double v = p[(size_t)s.nfeat * s.nobs + j];
      for (int k = 0; k < s.nobs; ++k) v += (double)p[j * s.nobs + k] * x[k];
      a[nin++] = sin(v);
    }
    p += s.nfeat * s.nobs + s.nfeat;
  }
  for (int k = 0; k < s.nobs; ++k) a[nin++] = x[k];
  for (int l = 0; l <= s.nhidden; ++l) {
    const int out = l == s.nhidden ? 1 : s.width;
    for (int j = 0; j < out; ++j) {
      double v = p[(size_t)out * nin + j];
      for (int i = 0; i < nin; ++i) v += (double)p[j * nin + i] * a[i];
      h[j] = l == s.nhidden ? v : (v > 0.0 ? v : 0.0);
    }
    p += out * nin + out;
    memcpy(a, h, sizeof(double) * (size_t)out);
    nin = out;
  }
  return a[0];
}

/* The gradient of the token-averaged clipped loss in double, for the weights of every
 * layer (not log_std): straight backpropagation, one step at a time. */
static void ref_grad(const network *n, const float *obs, const float *z, const float *logp_old,
                     const float *adv, const int64_t *rows, float log_std, double *gout)
{
  const shape s = n->s;
  const double inv_std = exp(-(double)log_std), lo = 0.8, hi = 1.28;
  size_t ng = 0;
  for (int l = 0; l <= s.nhidden; ++l) {
    const int in = l == 0 ? s.nfeat + s.nobs : s.width, out = l == s.nhidden ? 1 : s.width;
    ng += (size_t)out * in + out;
  }
  memset(gout, 0, sizeof(double) * ng);
  for (int r = 0; r < NROWS; ++r)
    for (int t = 0; t < L; ++t) {
      const size_t at = (size_t)rows[r] * L + t;
      double act[MAXH + 2][80]; /* act[0]: the first layer's input; act[l + 1]: layer l's output */
      int width[MAXH + 2];
      int m = 0;
      for (int j = 0; j < s.nfeat; ++j) {
        double v = n->pu.feat_b[j];
        for (int k = 0; k < s.nobs; ++k)
          v += (double)n->pu.feat_B[k * s.nfeat + j] * obs[at * s.nobs + k];
        act[0][m++] = sin(v);
      }
      for (int k = 0; k < s.nobs; ++k) act[0][m++] = obs[at * s.nobs + k];
      width[0] = m;
      for (int l = 0; l <= s.nhidden; ++l) {
        const int out = l == s.nhidden ? 1 : s.width;
        for (int j = 0; j < out; ++j) {
          double v = n->pu.b[l][j];
          for (int i = 0; i < width[l]; ++i) v += (double)n->pu.W[l][j * width[l] + i] * act[l][i];
          act[l + 1][j] = l == s.nhidden ? v : (v > 0.0 ? v : 0.0);
        }
        width[l + 1] = out;
      }
      const double mu = act[s.nhidden + 1][0], u = (z[at] - mu) * inv_std;
      const double logp = -0.5 * u * u - log_std - 0.5 * 1.8378770664093453;
      const double ratio = exp(logp - logp_old[at]), A = adv[at];
      if ((A < 0 && ratio < lo) || (A > 0 && ratio > hi)) continue;
      double dy[80];
      dy[0] = -A * ratio * u * inv_std / (NROWS * L);
      size_t off = ng;
      for (int l = s.nhidden; l >= 0; --l) {
        const int in = width[l], out = width[l + 1];
        off -= (size_t)out * in + out;
        for (int j = 0; j < out; ++j) {
          for (int i = 0; i < in; ++i) gout[off + (size_t)j * in + i] += dy[j] * act[l][i];
          gout[off + (size_t)out * in + j] += dy[j];
        }
        if (l == 0) break;
        double dx[80];
        for (int i = 0; i < in; ++i) {
          double v = 0.0;
          for (int j = 0; j < out; ++j) v += dy[j] * n->pu.W[l][j * in + i];
          dx[i] = act[l][i] > 0.0 ? v : 0.0;
        }
        memcpy(dy, dx, sizeof(double) * (size_t)in);
      }
    }
}

static int fail(const char *what, const char *path, const shape *s)
{
  printf("FAIL %s on the %s path (nobs %d nfeat %d nhidden %d width %d B %d)\n", what, path,
         s->nobs, s->nfeat, s->nhidden, s->width, s->B);
  return 1;
}

int main(int argc, char **argv)
{
  const int timing = argc > 1 && strcmp(argv[1], "--time") == 0;
  /* widths leaving every remainder of the gradient's blocks of 2, 3 and 4 outputs */
  const shape shapes[] = {{3, 64, 2, 32, 256}, {3, 64, 2, 64, 256}, {4, 9, 3, 33, 17},
                          {5, 0, 1, 5, 37}, {2, 16, 2, 13, 1}, {3, 8, 2, 7, 41}};
  const int nshapes = (int)(sizeof shapes / sizeof shapes[0]);
  static network net;
  static float obs[NBR * L * 5], z[NBR * L], logp_old[NBR * L], adv[NBR * L], mask[NBR * L];
  static float mu[256], mu_ref_path[256], grads_ref[MAXP], work[1 << 20];
  static float mu_all[NBR * L];
  int64_t rows[NROWS], all_rows[NBR];
  for (int r = 0; r < NROWS; ++r) rows[r] = 2 * r + 1;
  for (int r = 0; r < NBR; ++r) all_rows[r] = r;
  char paths[64];
  snprintf(paths, sizeof paths, "%s", pr_simd_paths());
  const char *start = pr_simd_path();
  printf("paths: %s (in use: %s)\n", paths, start);
  long checked = 0;
  for (int si = 0; si < nshapes; ++si) {
    const shape s = shapes[si];
    if (!make(&net, s)) return fail("a network of this shape", "any", &s);
    fill(obs, (size_t)NBR * L * s.nobs, -3.0, 3.0);
    fill(adv, NBR * L, -2.0, 2.0);
    fill(mask, NBR * L, 1.0, 1.0);
    const float log_std = -0.5f;
    const pu_batch bt = {.B = NBR, .L = L, .obs = obs, .z = z, .logp_old = logp_old, .adv = adv,
                         .mask = mask};
    if (pu_work_size(&net.pu) > sizeof work / sizeof work[0] ||
        pr_work_size(&net.pr, s.B) > sizeof work / sizeof work[0])
      return fail("the workspace's size", "any", &s);
    /* actions drawn around the network's mean, and pi_old's log-densities off the current
     * ones by up to +-0.3: ratios of 0.74..1.35, some clipped; the mean by the plain
     * loops, whose bits every machine shares (the default path may be a fused one) */
    pr_simd_select("plain");
    if (pu_mean(&net.pu, &bt, all_rows, NBR, mu_all, work) != PU_OK)
      return fail("pu_mean", "plain", &s);
    for (int i = 0; i < NBR * L; ++i) {
      const double noise = uniform(-1.5, 1.5);
      z[i] = (float)(mu_all[i] + noise * exp(log_std));
      logp_old[i] = (float)(-0.5 * noise * noise - log_std - 0.9189385332046727 +
                            uniform(-0.3, 0.3));
    }
    /* reference: the double-precision mean and gradient */
    static double gref[MAXP];
    ref_grad(&net, obs, z, logp_old, adv, rows, log_std, gref);
    const size_t ng = (size_t)(net.pu.gW[s.nhidden] - net.grads) + s.width + 1;
    double gmax = 0.0, mmax = 0.0;
    for (size_t i = 0; i < ng; ++i) gmax = fmax(gmax, fabs(gref[i]));
    /* every path, the plain one last: each must give the plain path's bits */
    char list[64];
    snprintf(list, sizeof list, "%s", paths);
    uint64_t digests[4];
    int npaths = 0;
    char *names[4];
    for (char *tok = strtok(list, " "); tok && npaths < 4; tok = strtok(NULL, " "))
      names[npaths++] = tok;
    for (int pi = npaths - 1; pi >= 0; --pi) {
      if (pr_simd_select(names[pi]) < 0) return fail("selecting the path", names[pi], &s);
      if (strcmp(pr_simd_path(), names[pi]) != 0) return fail("the path in use", names[pi], &s);
      if (pr_mean(&net.pr, s.B, obs, mu, work) != PS_OK) return fail("pr_mean", names[pi], &s);
      float g_log_std;
      pu_stats st;
      if (pu_gradient(&net.pu, log_std, &bt, rows, NROWS, PU_AGG_TOKEN, 0.2f, 0.28f, 0.0,
                      &g_log_std, &st, work) != PU_OK)
        return fail("pu_gradient", names[pi], &s);
      uint64_t h = fnv(0xCBF29CE484222325ull, mu, sizeof(float) * (size_t)s.B);
      h = fnv(h, net.grads, sizeof(float) * ng);
      h = fnv(h, &g_log_std, sizeof g_log_std);
      digests[pi] = h;
      if (pi == npaths - 1) { /* plain: against the double reference */
        for (int b = 0; b < s.B; ++b) mmax = fmax(mmax, fabs(ref_mean(&net, obs + b * s.nobs)));
        for (int b = 0; b < s.B; ++b)
          if (fabs(mu[b] - ref_mean(&net, obs + b * s.nobs)) > 1e-5 * mmax + 1e-6)
            return fail("the mean against the double reference", names[pi], &s);
        for (size_t i = 0; i < ng; ++i)
          if (fabs(net.grads[i] - gref[i]) > 1e-4 * gmax + 1e-9) {
            printf("gradient %zu: %.9g, reference %.9g (largest %.3g)\n", i, net.grads[i], gref[i],
                   gmax);
            return fail("the gradient against the double reference", names[pi], &s);
          }
        memcpy(mu_ref_path, mu, sizeof(float) * (size_t)s.B);
        memcpy(grads_ref, net.grads, sizeof(float) * ng);
        checked += s.B + (long)ng;
      } else {
        if (memcmp(mu, mu_ref_path, sizeof(float) * (size_t)s.B) != 0)
          return fail("the mean: not the plain path's bits", names[pi], &s);
        if (memcmp(net.grads, grads_ref, sizeof(float) * ng) != 0)
          return fail("the gradient: not the plain path's bits", names[pi], &s);
        checked += s.B + (long)ng;
      }
      printf("net %d x %d x %d x %d B %d: %s %016llx\n", s.nobs, s.nfeat, s.nhidden, s.width,
             s.B, names[pi], (unsigned long long)h);
    }
    if (timing && si < 2) {
      for (int rep = 0; rep < 3; ++rep)
        for (int pi = 0; pi < npaths; ++pi) {
          pr_simd_select(names[pi]);
          double t0 = now();
          int k = 0;
          for (; now() - t0 < 0.1; ++k) pr_mean(&net.pr, s.B, obs, mu, work);
          const double tm = (now() - t0) / k;
          float g_log_std;
          pu_stats st;
          t0 = now();
          for (k = 0; now() - t0 < 0.2; ++k)
            pu_gradient(&net.pu, log_std, &bt, rows, NROWS, PU_AGG_TOKEN, 0.2f, 0.28f, 0.0,
                        &g_log_std, &st, work);
          printf("time width %d %-8s mean %7.1f us  gradient %7.1f us\n", s.width, names[pi],
                 1e6 * tm, 1e6 * (now() - t0) / k);
        }
    }
    (void)digests;
  }
  pr_simd_select(start);
  printf("ok %ld\n", checked);
  return 0;
}
